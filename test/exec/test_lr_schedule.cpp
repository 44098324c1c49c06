// The learning-rate schedule (libexec/optim/lr_schedule.h) against rates
// worked out by hand from Megatron-LM's formulas, its checks, and the
// executor stepping with the rate it is given.
#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "fixtures.h"
#include "helpers.h"
#include "libexec/optim/lr_schedule.h"

using namespace spindle::exec;
using spindle::exec::test::one_device_plan;
using spindle::exec::test::OneDevice;
using spindle::exec::test::shipped_model;

TEST_CASE("lr schedule: warm-up, then linear and cosine decay, by hand", "[lr]") {
  // Peak 1e-3, floor 1e-4, warm-up W = 2, decay to step D + 1 = 11: step s
  // is at n = s - 1; after the warm-up r = (n - 2) / 8.
  LrSchedule s{1e-3, 1e-4, 2, 10, LrDecay::linear};
  const double pi = std::numbers::pi;
  const std::vector<double> warm = {0, 5e-4, 1e-3};   // n = 0, 1, 2: n / W of the peak
  for (int64_t step = 1; step <= 3; ++step)
    for (LrDecay d : {LrDecay::constant, LrDecay::linear, LrDecay::cosine}) {
      s.decay = d;
      CHECK(lr_at(s, step) == Approx(warm[static_cast<size_t>(step - 1)]).margin(1e-18));
    }
  s.decay = LrDecay::linear;
  CHECK(lr_at(s, 4) == Approx(1e-4 + (1 - 1.0 / 8) * 9e-4));   // n = 3, r = 1/8: 8.875e-4
  CHECK(lr_at(s, 4) == Approx(8.875e-4));
  CHECK(lr_at(s, 7) == Approx(5.5e-4));                        // r = 1/2
  CHECK(lr_at(s, 11) == Approx(1e-4));                         // n = D: r = 1
  CHECK(lr_at(s, 12) == 1e-4);                                 // past D: the floor
  CHECK(lr_at(s, 1000) == 1e-4);
  s.decay = LrDecay::cosine;
  CHECK(lr_at(s, 4) == Approx(1e-4 + 0.5 * (std::cos(pi / 8) + 1) * 9e-4));   // 9.6575e-4
  CHECK(lr_at(s, 4) == Approx(9.657469e-4));
  CHECK(lr_at(s, 7) == Approx(5.5e-4));                        // cos(pi / 2) = 0: half way
  CHECK(lr_at(s, 9) == Approx(1e-4 + 0.5 * (std::cos(pi * 6 / 8) + 1) * 9e-4));   // 2.318019e-4
  CHECK(lr_at(s, 11) == Approx(1e-4));
  CHECK(lr_at(s, 12) == 1e-4);
  s.decay = LrDecay::constant;
  for (int64_t step : {4, 11, 12, 1000}) CHECK(lr_at(s, step) == 1e-3);
  // No warm-up: the first step already at the peak; decay from n = 0.
  const LrSchedule cold{2e-3, 0, 0, 4, LrDecay::linear};
  const std::vector<double> want = {2e-3, 1.5e-3, 1e-3, 5e-4, 0, 0};
  for (int64_t step = 1; step <= 6; ++step) CHECK(lr_at(cold, step) == Approx(want[static_cast<size_t>(step - 1)]).margin(1e-18));
  // Constant without warm-up: today's rate at every step.
  for (int64_t step : {1, 2, 1000}) CHECK(lr_at(LrSchedule{3e-3, 0, 0, 0, LrDecay::constant}, step) == 3e-3);
}

TEST_CASE("lr schedule: what it refuses, names, and compares", "[lr]") {
  CHECK(check_lr_schedule({3e-3, 0, 0, 0, LrDecay::constant}).empty());
  CHECK(check_lr_schedule({3e-3, 3e-3, 5, 6, LrDecay::cosine}).empty());   // floor = peak: allowed
  const std::pair<LrSchedule, std::string> bad[] = {
      {{0, 0, 0, 0, LrDecay::constant}, "--lr 0: expected a learning rate above 0 and at most 1"},
      {{2, 0, 0, 0, LrDecay::constant}, "--lr 2: expected a learning rate above 0 and at most 1"},
      {{std::nan(""), 0, 0, 0, LrDecay::constant}, "--lr nan: expected a learning rate above 0 and at most 1"},
      {{1e-3, 2e-3, 0, 5, LrDecay::linear}, "--min-lr 0.002: expected a rate from 0 to --lr (0.001)"},
      {{1e-3, -1e-5, 0, 5, LrDecay::linear}, "--min-lr -0.00001: expected a rate from 0 to --lr (0.001)"},
      {{1e-3, 0, -1, 5, LrDecay::linear}, "--lr-warmup-steps -1: expected 0 or more"},
      {{1e-3, 0, 5, 5, LrDecay::cosine},
       "--lr-decay-steps 5 (default: --steps): cosine decay needs more steps than the warm-up (--lr-warmup-steps 5)"},
  };
  for (const auto& [s, why] : bad) CHECK(check_lr_schedule(s) == why);

  for (LrDecay d : {LrDecay::constant, LrDecay::linear, LrDecay::cosine}) CHECK(parse_lr_decay(lr_decay_name(d)) == d);
  CHECK_FALSE(parse_lr_decay("Cosine"));
  CHECK_FALSE(parse_lr_decay(""));

  CHECK(describe_lr_schedule({3e-3, 0, 0, 0, LrDecay::constant}) == "constant 0.003");
  CHECK(describe_lr_schedule({3e-3, 0, 100, 0, LrDecay::constant}) == "warm-up 100 steps to 0.003");
  CHECK(describe_lr_schedule({3e-3, 0, 1, 0, LrDecay::constant}) == "warm-up 1 step to 0.003");
  CHECK(describe_lr_schedule({3e-3, 3e-4, 100, 1000, LrDecay::cosine}) ==
        "warm-up 100 steps to 0.003, cosine decay to 0.0003 at step 1001");

  // The peak as AdamW holds it (a float, what a checkpoint records).
  const LrSchedule a{3e-3, 1e-4, 2, 10, LrDecay::cosine};
  CHECK(same_lr_schedule(a, {static_cast<float>(3e-3), 1e-4, 2, 10, LrDecay::cosine}));
  CHECK_FALSE(same_lr_schedule(a, {3.1e-3, 1e-4, 2, 10, LrDecay::cosine}));
  CHECK_FALSE(same_lr_schedule(a, {3e-3, 2e-4, 2, 10, LrDecay::cosine}));
  CHECK_FALSE(same_lr_schedule(a, {3e-3, 1e-4, 3, 10, LrDecay::cosine}));
  CHECK_FALSE(same_lr_schedule(a, {3e-3, 1e-4, 2, 11, LrDecay::cosine}));
  CHECK_FALSE(same_lr_schedule(a, {3e-3, 1e-4, 2, 10, LrDecay::linear}));
}

TEST_CASE("lr schedule: the executor steps with the rate set before each step", "[lr]") {
  const auto m = shipped_model("tiny-clip");
  const auto plan = one_device_plan(m);
  // Rate 0: AdamW leaves every parameter as it was (decay 1 - 0 * wd, no step).
  OneDevice zero(m, plan);
  const auto before = zero.ex->gather_params();
  zero.ex->set_learning_rate(0);
  zero.ex->step();
  const auto after = zero.ex->gather_params();
  REQUIRE(after.size() == before.size());
  for (const auto& [name, t] : before)
    for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(after.at(name)[i] == t[i]);
  // Rates set step by step equal executors built with each rate: step 1
  // at 1e-3 as an executor whose options fix 1e-3; step 2 at 5e-4 as an
  // executor fixed at 5e-4 that takes over the first one's state (bitwise:
  // the same arithmetic).
  OneDevice varied(m, plan);
  ExecOptions high, low;
  high.adamw.lr = 1e-3f;
  low.adamw.lr = 5e-4f;
  OneDevice fixed_high(m, plan, high), fixed_low(m, plan, low);
  varied.ex->set_learning_rate(1e-3f);
  CHECK(varied.ex->learning_rate() == 1e-3f);
  varied.ex->step();
  fixed_high.ex->step();
  fixed_low.ex->load_state(fixed_high.ex->gather_state());
  varied.ex->set_learning_rate(5e-4f);
  CHECK(varied.ex->step().task_loss == fixed_low.ex->step().task_loss);
  const auto want = fixed_low.ex->gather_params(), got = varied.ex->gather_params();
  REQUIRE(want.size() == got.size());
  for (const auto& [name, t] : want)
    for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(got.at(name)[i] == t[i]);
  // And not as step 2 at 1e-3: the rate made a difference.
  fixed_high.ex->step();
  const auto other = fixed_high.ex->gather_params();
  bool differs = false;
  for (const auto& [name, t] : other)
    for (int64_t i = 0; i < t.numel(); ++i) differs |= got.at(name)[i] != t[i];
  CHECK(differs);
}
