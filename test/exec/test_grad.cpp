// Every op's backward against central finite differences.
//
// Objective: f = sum_i out_i * r_i in double, r a fixed random tensor
// (backward gets dL/dout = r). Each parameter and differentiable input
// element x is moved by +-h (h = 1e-2, fp32 forward), and the central
// difference (f(x+h) - f(x-h)) / 2h must match the analytic gradient g:
// |fd - g| <= 2e-2 * |g| + 2e-3 * max(1, max |g| of the tensor).
// With fp32 outputs of magnitude ~1 the rounding noise of fd is ~1e-5 and
// its truncation error O(h^2) ~1e-4, well inside the tolerance.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include "helpers.h"
#include "libexec/ops/kernels.h"
#include "libexec/ops/op.h"

using namespace spindle::exec;
using spindle::exec::test::op_config;
using spindle::exec::test::perturb;
using spindle::exec::test::random_ids;
using spindle::exec::test::random_tensor;

namespace {

double objective(Op& op, const std::vector<Tensor>& in, const Tensor& r) {
  const Tensor out = op_forward(op, in);
  double f = 0;
  for (int64_t i = 0; i < out.numel(); ++i) f += static_cast<double>(out[i]) * r[i];
  return f;
}

// Checks d objective / d x for every element of x against `analytic`.
void check_fd(const std::string& what, Op& op, std::vector<Tensor>& in, const Tensor& r, Tensor& x,
              const Tensor& analytic) {
  constexpr float h = 1e-2f;
  double gmax = 1;
  for (int64_t i = 0; i < analytic.numel(); ++i) gmax = std::max(gmax, std::abs(double(analytic[i])));
  int bad = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float x0 = x[i];
    x[i] = x0 + h;
    const double fp = objective(op, in, r);
    x[i] = x0 - h;
    const double fm = objective(op, in, r);
    x[i] = x0;
    const double fd = (fp - fm) / (2.0 * h), g = analytic[i];
    if (std::abs(fd - g) > 2e-2 * std::abs(g) + 2e-3 * gmax) {
      if (++bad <= 5) UNSCOPED_INFO(what << "[" << i << "]: finite difference " << fd << " vs backward " << g);
    }
  }
  CHECK(bad == 0);
}

// Runs forward + backward once, then checks every parameter and the inputs
// flagged in `diff_inputs`.
void check_op(const OpConfig& cfg, std::vector<Tensor> in, const std::vector<bool>& diff_inputs) {
  ParamSet params = make_params(cfg, "m/0.0", 7);
  perturb(params, 11);
  Op op = make_op(cfg, params);
  const Tensor out = op_forward(op, in);
  const Tensor r = random_tensor(out.shape(), 5);
  params.zero_grads();
  const std::vector<Tensor> grads = op_backward(op, r);
  std::vector<Tensor> pgrads;
  for (Param& p : params.params) pgrads.push_back(p.grad.clone());
  for (size_t k = 0; k < params.params.size(); ++k)
    check_fd(params.params[k].name, op, in, r, params.params[k].value, pgrads[k]);
  size_t gi = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    if (!diff_inputs[k]) continue;
    REQUIRE(gi < grads.size());
    REQUIRE(grads[gi].numel() == in[k].numel());
    check_fd("input " + std::to_string(k), op, in, r, in[k], grads[gi]);
    ++gi;
  }
  CHECK(gi == grads.size());
}

}  // namespace

TEST_CASE("linear backward matches finite differences", "[grad]") {
  check_op(op_config(OpKind::linear, {{"in", 4}, {"out", 3}}), {random_tensor({2, 3, 4}, 1)}, {true});
}

TEST_CASE("patch_embed backward matches finite differences", "[grad]") {
  check_op(op_config(OpKind::patch_embed, {{"in_dim", 5}, {"hidden", 4}}, 4),
           {random_tensor({2, 3, 5}, 1)}, {false});
}

TEST_CASE("token_embed backward matches finite differences", "[grad]") {
  check_op(op_config(OpKind::token_embed, {{"vocab", 7}, {"hidden", 4}}, 5), {random_ids({2, 3}, 7, 3)},
           {false});
}

TEST_CASE("transformer_layer backward matches finite differences", "[grad]") {
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    check_op(op_config(OpKind::transformer_layer,
                    {{"hidden", 8}, {"heads", 2}, {"ffn", 12}, {"causal", causal}}),
             {random_tensor({2, 3, 8}, 1)}, {true});
  }
}

TEST_CASE("pool_project backward matches finite differences", "[grad]") {
  check_op(op_config(OpKind::pool_project, {{"in", 6}, {"out", 4}}), {random_tensor({3, 4, 6}, 1)},
           {true});
}

TEST_CASE("contrastive_loss backward matches finite differences", "[grad]") {
  for (double t : {0.07, 0.5}) {
    INFO("temperature " << t);
    check_op(op_config(OpKind::contrastive_loss, {{"dim", 4}, {"temperature", t}}),
             {random_tensor({3, 1, 4}, 1), random_tensor({3, 1, 4}, 2)}, {true, true});
  }
}

TEST_CASE("lm_loss backward matches finite differences", "[grad]") {
  check_op(op_config(OpKind::lm_loss, {{"hidden", 6}, {"vocab", 5}}),
           {random_tensor({2, 3, 6}, 1), random_ids({2, 3}, 5, 4)}, {true, false});
}

TEST_CASE("lm_loss backward with ignored targets (-1) matches finite differences", "[grad]") {
  Tensor targets = random_ids({2, 3}, 5, 4);
  targets[0] = -1;
  targets[4] = -1;
  check_op(op_config(OpKind::lm_loss, {{"hidden", 6}, {"vocab", 5}}), {random_tensor({2, 3, 6}, 1), targets},
           {true, false});
}

// Parameter gradients that the executor binds into a bucket's flat buffer
// lie at any float offset (the bucket layout's); a device backend keeps
// them apart. Their column sums (a bias, LayerNorm's gain and bias) must
// not depend on that: Eigen's vectorised loop, adding straight into the
// destination, started at its first 16-byte boundary and summed the
// columns before it in another order (random model 3 on 3 devices: 4 of
// 12 values of a bias 1 ulp or more apart between two bucket caps).
TEST_CASE("bias and LayerNorm gradients are the same bits at any offset in memory", "[grad]") {
  const int64_t rows = 50, in = 5, out = 12;
  const Tensor x = random_tensor({rows, in}, 21), w = random_tensor({in, out}, 22);
  const Tensor dy = random_tensor({rows, out}, 23, 100.0f);   // large addends: rounding shows
  LayerNormCache cache;
  const Tensor gamma = random_tensor({out}, 24), beta = random_tensor({out}, 25);
  layernorm_forward(random_tensor({rows, out}, 26), gamma, beta, cache);
  // The gradients computed into separate tensors, then into views at
  // float offsets 0..7 of one zeroed buffer.
  auto grads_at = [&](float* base) {
    auto view = [&](int64_t k) {
      return Tensor::wrap({out}, Device::host, std::shared_ptr<float[]>(std::shared_ptr<float[]>(), base + k * 16));
    };
    Tensor dw = Tensor::zeros({in, out}), db = view(0), dgamma = view(1), dbeta = view(2);
    linear_rows_backward(x, w, dy, dw, &db, false);
    layernorm_backward(dy, gamma, cache, dgamma, dbeta);
    return std::vector<Tensor>{db.clone(), dgamma.clone(), dbeta.clone()};
  };
  std::vector<float> apart(3 * 16, 0.0f);
  const std::vector<Tensor> want = grads_at(apart.data());
  for (int offset = 0; offset < 8; ++offset) {
    std::vector<float> buffer(3 * 16 + 8, 0.0f);
    const std::vector<Tensor> got = grads_at(buffer.data() + offset);
    for (size_t g = 0; g < got.size(); ++g) {
      int differ = 0;
      for (int64_t i = 0; i < out; ++i) differ += got[g][i] != want[g][i];
      INFO("offset " << offset << " floats, gradient " << g << " (db, dgamma, dbeta)");
      CHECK(differ == 0);
    }
  }
}
