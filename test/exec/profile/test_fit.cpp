// Pure helpers of spindle-profile --measure (libexec/profile/fit.h): summary
// statistics, the link fits on synthetic timings with known figures, and the
// leave-one-out error of the piecewise curve on hand-made points.
#include <catch2/catch.hpp>

#include <cmath>

#include "libexec/profile/fit.h"

using spindle::exec::fit_line;
using spindle::exec::fit_p2p_link;
using spindle::exec::leave_one_out_errors;
using spindle::exec::timing_stats;
using spindle::plan::ProfilePoint;

TEST_CASE("timing_stats: median and 10th/90th percentiles, interpolated", "[profile][fit]") {
  // 1..10 in scrambled order: position 0.1 * 9 = 0.9 -> 1.9; 0.5 * 9 = 4.5 -> 5.5; 0.9 * 9 = 8.1 -> 9.1.
  const auto st = timing_stats({7, 3, 10, 1, 5, 2, 9, 4, 8, 6});
  CHECK(st.median == Approx(5.5));
  CHECK(st.p10 == Approx(1.9));
  CHECK(st.p90 == Approx(9.1));
  CHECK(st.spread() == Approx((9.1 - 1.9) / 5.5));
  const auto one = timing_stats({4.0});
  CHECK(one.median == 4.0);
  CHECK(one.spread() == 0.0);
}

TEST_CASE("fit_p2p_link recovers a known latency and bandwidth", "[profile][fit]") {
  const double latency_us = 20, gbytes_per_s = 5;
  std::vector<double> bytes{64, 1024, 16384, 262144, 1048576}, ms;
  for (double b : bytes) ms.push_back(latency_us * 1e-3 + b / (gbytes_per_s * 1e9) * 1e3);
  auto link = fit_p2p_link(bytes, ms);
  REQUIRE(link.ok());
  CHECK(link->latency_us == Approx(latency_us).epsilon(1e-9));
  CHECK(link->gbytes_per_s == Approx(gbytes_per_s).epsilon(1e-9));

  // +-3% alternating noise: still within 5% on both figures.
  for (size_t i = 0; i < ms.size(); ++i) ms[i] *= i % 2 ? 1.03 : 0.97;
  auto noisy = fit_p2p_link(bytes, ms);
  REQUIRE(noisy.ok());
  CHECK(noisy->latency_us == Approx(latency_us).epsilon(0.05));
  CHECK(noisy->gbytes_per_s == Approx(gbytes_per_s).epsilon(0.05));
}

TEST_CASE("fit_line: a negative intercept is refitted through the origin, bad data is an error", "[profile][fit]") {
  // Points on t = 2 x - 1 would give intercept -1: through the origin the
  // slope is sum(x t) / sum(x^2) = (1*1 + 2*3 + 3*5) / 14 = 22 / 14.
  auto f = fit_line({1, 2, 3}, {1, 3, 5});
  REQUIRE(f.ok());
  CHECK(f->intercept == 0.0);
  CHECK(f->slope == Approx(22.0 / 14.0));
  CHECK_FALSE(fit_line({5, 5, 5}, {1, 2, 3}).ok());   // one distinct size
  CHECK_FALSE(fit_line({1, 2, 3}, {3, 2, 1}).ok());   // time falls with size
  CHECK_FALSE(fit_line({1}, {1}).ok());
}

TEST_CASE("leave_one_out_errors on hand-made curves", "[profile][fit]") {
  // Exactly alpha + beta / n (alpha 2, beta 8): every left-out point is recovered.
  std::vector<ProfilePoint> exact;
  for (int n : {1, 2, 4, 8}) exact.push_back({n, 2.0 + 8.0 / n, 0});
  const auto e0 = leave_one_out_errors(exact);
  REQUIRE(e0.size() == 2);   // interior points n = 2 and n = 4
  CHECK(e0[0] == Approx(0).margin(1e-12));
  CHECK(e0[1] == Approx(0).margin(1e-12));

  // 1: 10 ms, 2: 7 ms, 4: 4 ms. Without n = 2 the piece through (1, 10) and
  // (4, 4) has beta = 6 / 0.75 = 8, alpha = 2: T(2) = 6, error 1/7.
  const auto e1 = leave_one_out_errors({{1, 10, 0}, {2, 7, 0}, {4, 4, 0}});
  REQUIRE(e1.size() == 1);
  CHECK(e1[0] == Approx(1.0 / 7.0));

  CHECK(leave_one_out_errors({{1, 10, 0}, {2, 6, 0}}).empty());
}

TEST_CASE("fit_line_relative weighs small sizes: the intercept of a known alpha-beta line", "[profile][fit]") {
  // t = 0.02 ms + x / 1e6 (1 GB/s), exact: both fits recover it.
  std::vector<double> x{64, 1024, 65536, 4 << 20}, t;
  for (double b : x) t.push_back(0.02 + b * 1e-6);
  auto f = spindle::exec::fit_line_relative(x, t);
  REQUIRE(f.ok());
  CHECK(f->intercept == Approx(0.02).epsilon(1e-9));
  CHECK(f->slope == Approx(1e-6).epsilon(1e-9));
  // +10% on the largest point only: the plain fit's intercept absorbs the
  // large point's error (0.0178 ms, 11% off), the relative one stays within
  // 1% of 0.02 ms (0.01986).
  t.back() *= 1.1;
  auto rel = spindle::exec::fit_line_relative(x, t);
  auto plain = fit_line(x, t);
  REQUIRE(rel.ok());
  REQUIRE(plain.ok());
  CHECK(rel->intercept == Approx(0.02).epsilon(0.01));
  CHECK(std::abs(plain->intercept - 0.02) > 0.002);
  CHECK_FALSE(spindle::exec::fit_line_relative({1, 2}, {1, 0}).ok());   // times must be positive
}

TEST_CASE("fit_copy, fit_allreduce and fit_exchange recover hand-set overhead figures", "[profile][fit]") {
  // Copies: 3 us + bytes / 8 GB/s.
  std::vector<double> bytes{256, 4096, 65536, 1 << 20}, ms;
  for (double b : bytes) ms.push_back(3e-3 + b / 8e9 * 1e3);
  auto copy = spindle::exec::fit_copy(bytes, ms);
  REQUIRE(copy.ok());
  CHECK(copy->copy_us == Approx(3.0).epsilon(1e-9));
  CHECK(copy->pack_gbytes_per_s == Approx(8.0).epsilon(1e-9));

  // All-reduce over 2 ranks at 4 GB/s with 20 us per call and a 1.5 us
  // send/recv latency: t = 1/2 * 2 * B / 4e9 s + 2 * 1.5 us + 20 us.
  ms.clear();
  for (double b : bytes) ms.push_back(b / 4e9 * 1e3 + (2 * 1.5 + 20) * 1e-3);
  auto ar = spindle::exec::fit_allreduce(bytes, ms, 2, 1.5);
  REQUIRE(ar.ok());
  CHECK(ar->link.gbytes_per_s == Approx(4.0).epsilon(1e-9));
  CHECK(ar->link.latency_us == 1.5);
  CHECK(ar->allreduce_us == Approx(20.0).epsilon(1e-9));
  // A latency larger than the intercept: no negative fixed cost.
  CHECK(spindle::exec::fit_allreduce(bytes, ms, 2, 50)->allreduce_us == 0.0);
  CHECK_FALSE(spindle::exec::fit_allreduce(bytes, ms, 1, 1.5).ok());
  {
    // 4 ranks, the cost model's ring at 2 GB/s and 8 us with no fixed cost:
    // t = 2 * 3/4 * B / bw + 2 * 3 * latency; the fit gives them back.
    std::vector<double> sizes{256, 4096, 65536, 1 << 20}, ring;
    for (double b : sizes) ring.push_back(1.5 * b / 2e9 * 1e3 + 6 * 8e-3);
    auto four = spindle::exec::fit_allreduce(sizes, ring, 4, 8.0);
    REQUIRE(four.ok());
    CHECK(four->link.gbytes_per_s == Approx(2.0).epsilon(1e-9));
    CHECK(four->allreduce_us == Approx(0.0).margin(1e-6));
  }

  // Exchanges of k = 1, 2, 4, 8 messages each way, 0.01 ms per message on
  // the wire: t = 30 us + 2k * 4 us + k * 0.01 ms.
  const std::vector<double> k{1, 2, 4, 8};
  ms.clear();
  for (double m : k) ms.push_back(0.030 + 2 * m * 0.004 + m * 0.01);
  auto ex = spindle::exec::fit_exchange(k, ms, 0.01);
  REQUIRE(ex.ok());
  CHECK(ex->exchange_us == Approx(30.0).epsilon(1e-9));
  CHECK(ex->message_us == Approx(4.0).epsilon(1e-9));
  // Times that fall with k (noise): message_us 0, exchange_us the mean residual.
  auto flat = spindle::exec::fit_exchange(k, {0.05, 0.06, 0.08, 0.11}, 0.01);
  REQUIRE(flat.ok());
  CHECK(flat->message_us == 0.0);
  CHECK(flat->exchange_us == Approx((0.04 + 0.04 + 0.04 + 0.03) / 4 * 1e3));
  CHECK_FALSE(spindle::exec::fit_exchange({2, 2}, {0.1, 0.1}, 0.01).ok());
}

TEST_CASE("fit_executor_overhead recovers the executor's figures, each >= 0") {
  using spindle::exec::OverheadSample;
  // Generated from instruction 0.6 us, 1.5 us per message, adding at 10 GB/s
  // (1e4 bytes: 1 us): a forward exchange of local views, post_sends of
  // 1 and 2 messages, a post_recv, backward exchanges adding 26112 and 6144 bytes.
  auto us = [](double messages, double bytes) { return 0.6 + 1.5 * messages + bytes / 1e4; };
  std::vector<OverheadSample> s = {{us(0, 0), 0, 0},         {us(1, 0), 1, 0},         {us(2, 0), 2, 0},
                                   {us(0, 0), 0, 0},         {us(0, 26112), 0, 26112}, {us(0, 6144), 0, 6144}};
  auto f = spindle::exec::fit_executor_overhead(s);
  REQUIRE(f.ok());
  CHECK(f->instruction_us == Approx(0.6).epsilon(1e-9));
  CHECK(f->message_us == Approx(1.5).epsilon(1e-9));
  CHECK(f->accumulate_gbytes_per_s == Approx(10.0).epsilon(1e-9));
  CHECK(f->rms_residual_us == Approx(0.0).margin(1e-9));

  // No instruction adds anything: the rate is 0 (not priced), the rest fitted.
  s.resize(4);
  auto no_adds = spindle::exec::fit_executor_overhead(s);
  REQUIRE(no_adds.ok());
  CHECK(no_adds->accumulate_gbytes_per_s == 0.0);
  CHECK(no_adds->message_us == Approx(1.5).epsilon(1e-9));

  // Times that fall with the messages (noise): the unconstrained slope is
  // negative, so messages cost 0 and the instruction is the mean, 2 us.
  auto falling = spindle::exec::fit_executor_overhead({{3.0, 0, 0}, {2.0, 1, 0}, {1.0, 2, 0}});
  REQUIRE(falling.ok());
  CHECK(falling->message_us == 0.0);
  CHECK(falling->instruction_us == Approx(2.0).epsilon(1e-9));
  CHECK(falling->rms_residual_us == Approx(std::sqrt(2.0 / 3.0)).epsilon(1e-9));

  CHECK_FALSE(spindle::exec::fit_executor_overhead({{1.0, 0, 0}}).ok());
}
