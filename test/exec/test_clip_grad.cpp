// Gradient clipping (ExecOptions::clip_grad, spindle-run --clip-grad): the
// global norm the executor reports against one computed here from the full
// gradients, and the clipped step against AdamW run here on the gradients
// scaled by the factor clip / (norm + 1e-6).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "fixtures.h"
#include "helpers.h"
#include "libexec/optim/adamw.h"

using namespace spindle::exec;
using spindle::exec::test::one_device_plan;
using spindle::exec::test::OneDevice;
using spindle::exec::test::shipped_model;

namespace {

// sqrt of the sum of squares of every value of every tensor, in double.
double norm_of(const std::map<std::string, Tensor>& tensors) {
  double squares = 0;
  for (const auto& [name, t] : tensors)
    for (int64_t i = 0; i < t.numel(); ++i) squares += static_cast<double>(t[i]) * t[i];
  return std::sqrt(squares);
}

ExecOptions with_norm(double clip) {
  ExecOptions o;
  o.sync.grad_norm = true;
  o.clip_grad = clip;
  return o;
}

}  // namespace

TEST_CASE("backend: sum_squares adds every value's square in double", "[clip]") {
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  Tensor a = Tensor::zeros({3}), b = Tensor::zeros({2, 2}), empty = Tensor::zeros({0});
  a[0] = 1.5f, a[1] = -2.0f, a[2] = 1e-20f;   // 1e-40 still counts in double
  b[0] = 3.0f, b[3] = -0.5f;
  const std::vector<Tensor> all{a, empty, b};
  CHECK(cpu->sum_squares(all) == 2.25 + 4.0 + static_cast<double>(1e-20f) * 1e-20f + 9.0 + 0.25);
  CHECK(cpu->sum_squares(std::span<const Tensor>()) == 0.0);
}

TEST_CASE("adamw: grad_scale multiplies each gradient first, as scaling the gradients by hand", "[clip]") {
  AdamWConfig scaled;
  scaled.lr = 1e-2f;
  scaled.grad_scale = 0.37f;
  AdamWConfig plain = scaled;
  plain.grad_scale = 1.0f;
  Tensor p1 = Tensor::zeros({4}), m1 = Tensor::zeros({4}), v1 = Tensor::zeros({4});
  Tensor p2 = Tensor::zeros({4}), m2 = Tensor::zeros({4}), v2 = Tensor::zeros({4});
  Tensor g = Tensor::zeros({4}), g_scaled = Tensor::zeros({4});
  const float values[4] = {0.5f, -3.0f, 1e-9f, 7.25f};
  for (int i = 0; i < 4; ++i) {
    p1[i] = p2[i] = 1.0f - static_cast<float>(i);
    g[i] = values[i];
    g_scaled[i] = values[i] * 0.37f;
  }
  for (int64_t step = 1; step <= 3; ++step) {
    adamw_step(scaled, step, p1, g, m1, v1);
    adamw_step(plain, step, p2, g_scaled, m2, v2);
  }
  for (int i = 0; i < 4; ++i) {
    CHECK(p1[i] == p2[i]);
    CHECK(m1[i] == m2[i]);
    CHECK(v1[i] == v2[i]);
  }
}

TEST_CASE("executor: the gradient norm is the full gradients' L2 norm, and clipping scales them by clip / (norm + 1e-6)",
          "[clip]") {
  const auto m = shipped_model("tiny-clip");
  const auto plan = one_device_plan(m);
  // Without the norm in the programs, the step reports none.
  OneDevice bare(m, plan);
  CHECK_FALSE(bare.ex->step().grad_norm.has_value());
  // With it, two instructions more: the local sum of squares over every
  // parameter value of the model (one device holds them all), and the
  // all-reduce.
  const OneDevice normed(m, plan, with_norm(0));
  const std::vector<spindle::plan::Instr>& instrs = normed.ex->lowered().programs[0].instrs;
  CHECK(bare.ex->lowered().programs[0].instrs.size() + 2 == instrs.size());
  int64_t values = 0;
  for (const auto& [name, shape] : normed.ex->param_shapes()) values += shape_numel(shape);
  const auto sum = std::find_if(instrs.begin(), instrs.end(),
                                [](const spindle::plan::Instr& in) { return in.kind == spindle::plan::InstrKind::norm_sum; });
  REQUIRE(sum != instrs.end());
  CHECK(sum->values == values);
  CHECK(values > 40000);

  // The norm computed, not clipped: the norm of the full gradients.
  OneDevice unclipped(m, plan, with_norm(0));
  const auto before = unclipped.ex->gather_params();
  const StepStats st = unclipped.ex->step();
  REQUIRE(st.grad_norm.has_value());
  const double norm = norm_of(unclipped.ex->gather_grads());
  CHECK(norm > 1);
  CHECK(*st.grad_norm == Approx(norm).epsilon(1e-6));
  const auto after_unclipped = unclipped.ex->gather_params();

  // Clipped to a quarter of it: every tensor stepped as AdamW steps its
  // gradient times the factor, computed here from the reported norm.
  const double clip = norm / 4;
  OneDevice clipped(m, plan, with_norm(clip));
  const StepStats cst = clipped.ex->step();
  REQUIRE(cst.grad_norm.has_value());
  CHECK(*cst.grad_norm == *st.grad_norm);   // the norm before clipping, the same gradients
  const float factor = static_cast<float>(clip / (*cst.grad_norm + 1e-6));
  CHECK(factor == Approx(0.25).epsilon(1e-5));
  const auto grads = clipped.ex->gather_grads();   // the gradients AdamW got, before its scaling
  const auto got = clipped.ex->gather_params();
  const AdamWConfig cfg = ExecOptions{}.adamw;
  REQUIRE(got.size() == before.size());
  for (const auto& [name, p0] : before) {
    Tensor p = p0.clone(), g = grads.at(name).clone();
    Tensor mm = Tensor::zeros(p.shape()), vv = Tensor::zeros(p.shape());
    for (int64_t i = 0; i < g.numel(); ++i) g[i] *= factor;
    adamw_step(cfg, 1, p, g, mm, vv);
    for (int64_t i = 0; i < p.numel(); ++i) REQUIRE(got.at(name)[i] == p[i]);
  }

  // A clip above the norm changes nothing: the unclipped step, bitwise.
  OneDevice loose(m, plan, with_norm(norm * 2));
  loose.ex->step();
  const auto same = loose.ex->gather_params();
  for (const auto& [name, t] : after_unclipped)
    for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(same.at(name)[i] == t[i]);

  // Clipping made a difference: after a second step (the moments mix the
  // steps' scales) the clipped run's parameters are not the unclipped ones.
  clipped.ex->step();
  unclipped.ex->step();
  const auto two_clipped = clipped.ex->gather_params(), two_unclipped = unclipped.ex->gather_params();
  bool differs = false;
  for (const auto& [name, t] : two_unclipped)
    for (int64_t i = 0; i < t.numel(); ++i) differs |= two_clipped.at(name)[i] != t[i];
  CHECK(differs);
}

TEST_CASE("executor: clipping without the norm in the programs, or by a bad bound, is refused", "[clip]") {
  const auto m = shipped_model("tiny-clip");
  const auto plan = one_device_plan(m);
  ExecOptions no_norm;
  no_norm.clip_grad = 1.0;
  CHECK_THROWS_WITH(OneDevice(m, plan, no_norm), Catch::Contains("GradSync::grad_norm"));
  for (double bad : {-1.0, std::nan(""), static_cast<double>(INFINITY)})
    CHECK_THROWS_AS(OneDevice(m, plan, with_norm(bad)), std::invalid_argument);
}
