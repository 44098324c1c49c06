// CUDA backend parity with the CPU backend (label gpu; docs/gpu.md). Every
// op of the catalogue, forward and backward, plus AdamW: the same
// parameters, inputs and output gradient through both backends; outputs,
// input gradients and every parameter gradient compared as
//   max |cuda - cpu| <= tol * max(max |cpu|, 1e-6)
// with tol 1e-4 in the fp32 mode and 2e-2 in the bf16 mode (bf16 products;
// the transformer layer also stores its internals in bf16). Each op runs
// twice on the GPU: with host tensors (the executor's path: staged) and with
// parameters, inputs and gradients in device memory (the native path).
// Without a CUDA device every test but the first exits 77 (ctest: skipped).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "helpers.h"
#include "libexec/backend/backend.h"
#include "libexec/backend/cuda/cuda_backend.h"
#include "libexec/ops/op.h"
#include "libexec/optim/adamw.h"

using namespace spindle::exec;
using spindle::exec::test::perturb;
using spindle::exec::test::random_ids;
using spindle::exec::test::random_tensor;

namespace {

void skip_without_gpu() {
  if (cuda_device_count() > 0) return;
  std::printf("SKIPPED: no CUDA device visible\n");
  std::fflush(stdout);
  std::exit(77);
}

double tolerance(MatmulPrecision m) { return m == MatmulPrecision::fp32 ? 1e-4 : 2e-2; }

// max |got - want| relative to the largest |want| (floor 1e-6).
double rel_err(const Tensor& got, const Tensor& want) {
  REQUIRE(got.numel() == want.numel());
  double diff = 0, scale = 1e-6;
  for (int64_t i = 0; i < want.numel(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
  }
  return diff / scale;
}

Tensor to_host(Backend& b, const Tensor& t) {
  if (t.device() == Device::host) return t;
  Tensor h = Tensor::zeros(t.shape());
  b.copy(t, h);
  b.synchronize();
  return h;
}

Tensor to_dev(Backend& b, const Tensor& h) {
  Tensor t = b.allocate(h.shape());
  b.copy(h, t);
  return t;
}

OpConfig config(OpKind kind, nlohmann::json dims, int64_t max_seq = 0) {
  OpConfig c;
  c.kind = kind;
  c.dims = std::move(dims);
  c.max_seq = max_seq;
  return c;
}

struct Case {
  OpConfig cfg;
  std::vector<Tensor> inputs;  // host
};

struct Result {
  Tensor y;
  std::vector<Tensor> dx;
  std::vector<Tensor> grads;  // per parameter
};

// One forward and backward of `c` on `backend`; parameters (seeded,
// perturbed) and, when `on_device`, inputs and dy in the backend's memory.
Result run(Backend& backend, const Case& c, bool on_device) {
  ParamSet ps = make_params(c.cfg, "gpu/0.0", 11);
  perturb(ps, 5, 0.3f);
  if (on_device)
    for (Param& p : ps.params) {
      p.value = to_dev(backend, p.value);
      p.grad = to_dev(backend, p.grad);
    }
  Op op = make_op(c.cfg, ps);
  std::vector<Tensor> in;
  for (const Tensor& t : c.inputs) in.push_back(on_device ? to_dev(backend, t) : t);
  Result r;
  const Tensor y = backend.forward(op, in);
  r.y = to_host(backend, y);
  const bool loss = c.cfg.kind == OpKind::contrastive_loss || c.cfg.kind == OpKind::lm_loss;
  Tensor dy = loss ? Tensor::from({1}, {0.7f}) : random_tensor(y.shape(), 29);
  if (on_device) dy = to_dev(backend, dy);
  for (const Tensor& d : backend.backward(op, dy)) r.dx.push_back(to_host(backend, d));
  for (Param& p : ps.params) r.grads.push_back(to_host(backend, p.grad));
  return r;
}

void check_parity(const Case& c, MatmulPrecision m) {
  skip_without_gpu();
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  std::unique_ptr<Backend> gpu = make_cuda_backend({m});
  const double tol = tolerance(m);
  const Result want = run(*cpu, c, false);
  for (bool on_device : {false, true}) {
    INFO(op_name(c.cfg.kind) << (on_device ? ", device tensors" : ", host tensors") << ", tolerance " << tol);
    const Result got = run(*gpu, c, on_device);
    REQUIRE(got.y.shape() == want.y.shape());
    CHECK(rel_err(got.y, want.y) <= tol);
    REQUIRE(got.dx.size() == want.dx.size());
    for (size_t i = 0; i < want.dx.size(); ++i) {
      INFO("input gradient " << i);
      REQUIRE(got.dx[i].shape() == want.dx[i].shape());
      CHECK(rel_err(got.dx[i], want.dx[i]) <= tol);
    }
    for (size_t i = 0; i < want.grads.size(); ++i) {
      INFO("parameter gradient " << i);
      CHECK(rel_err(got.grads[i], want.grads[i]) <= tol);
    }
  }
}

std::vector<Case> catalogue() {
  std::vector<Case> cs;
  cs.push_back({config(OpKind::patch_embed, {{"in_dim", 12}, {"hidden", 16}}, 8), {random_tensor({3, 6, 12}, 1)}});
  cs.push_back({config(OpKind::token_embed, {{"vocab", 50}, {"hidden", 16}}, 8), {random_ids({3, 6}, 50, 2)}});
  cs.push_back({config(OpKind::transformer_layer, {{"hidden", 32}, {"heads", 4}, {"ffn", 64}}),
                {random_tensor({3, 7, 32}, 3)}});
  cs.push_back({config(OpKind::transformer_layer, {{"hidden", 32}, {"heads", 4}, {"ffn", 96}, {"causal", true}}),
                {random_tensor({2, 9, 32}, 4)}});
  cs.push_back({config(OpKind::linear, {{"in", 16}, {"out", 24}}), {random_tensor({3, 5, 16}, 5)}});
  cs.push_back({config(OpKind::pool_project, {{"in", 16}, {"out", 8}}), {random_tensor({3, 6, 16}, 6)}});
  cs.push_back({config(OpKind::contrastive_loss, {{"dim", 8}}),
                {random_tensor({5, 1, 8}, 7), random_tensor({5, 1, 8}, 8)}});
  cs.push_back({config(OpKind::lm_loss, {{"hidden", 16}, {"vocab", 40}}),
                {random_tensor({2, 5, 16}, 9), random_ids({2, 5}, 40, 10)}});
  return cs;
}

}  // namespace

TEST_CASE("make_backend(cuda): built, and refused with a message without a device", "[gpu]") {
  bool listed = false;
  for (auto n : backend_names()) listed = listed || n == "cuda";
  CHECK(listed);
  if (cuda_device_count() == 0) {
    CHECK_THROWS_WITH(make_backend("cuda"), Catch::Contains("no CUDA device"));
  } else {
    std::unique_ptr<Backend> b = make_backend("cuda");
    REQUIRE(b);
    CHECK(std::string(b->name()) == "cuda");
    CHECK(b->device() == Device::cuda);
  }
}

TEST_CASE("cuda allocate/copy round trip; allocate is zero-filled", "[gpu]") {
  skip_without_gpu();
  std::unique_ptr<Backend> b = make_cuda_backend();
  const Tensor h = random_tensor({4, 5}, 3);
  Tensor d = b->allocate({4, 5});
  CHECK(to_host(*b, d).vec().cwiseAbs().maxCoeff() == 0.0f);
  b->copy(h, d);
  const Tensor back = to_host(*b, d);
  for (int64_t i = 0; i < h.numel(); ++i) CHECK(back[i] == h[i]);
}

TEST_CASE("cuda parity, fp32 matmul: every op forward and backward (tol 1e-4)", "[gpu]") {
  for (const Case& c : catalogue()) check_parity(c, MatmulPrecision::fp32);
}

TEST_CASE("cuda parity, bf16 mode: every op forward and backward (tol 2e-2)", "[gpu]") {
  for (const Case& c : catalogue()) check_parity(c, MatmulPrecision::bf16);
}

TEST_CASE("cuda parity at ViT-like width: transformer_layer hidden 128, 8 heads, seq 65 (bf16, tol 2e-2)", "[gpu]") {
  check_parity({config(OpKind::transformer_layer, {{"hidden", 128}, {"heads", 8}, {"ffn", 512}}),
                {random_tensor({4, 65, 128}, 12)}},
               MatmulPrecision::bf16);
}

TEST_CASE("cuda errors: a token id outside the vocabulary throws out_of_range", "[gpu]") {
  skip_without_gpu();
  std::unique_ptr<Backend> b = make_cuda_backend();
  const OpConfig cfg = config(OpKind::token_embed, {{"vocab", 10}, {"hidden", 4}}, 4);
  ParamSet ps = make_params(cfg, "gpu/0.0", 1);
  Op op = make_op(cfg, ps);
  const Tensor ids = Tensor::from({1, 2}, {3, 10});
  CHECK_THROWS_AS(b->forward(op, std::span(&ids, 1)), std::out_of_range);
}

TEST_CASE("cuda AdamW equals the CPU AdamW over 3 steps, host and device tensors (tol 1e-5)", "[gpu]") {
  skip_without_gpu();
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  std::unique_ptr<Backend> gpu = make_cuda_backend();
  const AdamWConfig cfg{3e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  for (bool on_device : {false, true}) {
    INFO((on_device ? "device tensors" : "host tensors"));
    Tensor p = random_tensor({257}, 1), m = Tensor::zeros({257}), v = Tensor::zeros({257});
    Tensor gp = p.clone(), gm = m.clone(), gv = v.clone();
    if (on_device) {
      gp = to_dev(*gpu, gp);
      gm = to_dev(*gpu, gm);
      gv = to_dev(*gpu, gv);
    }
    for (int64_t step = 1; step <= 3; ++step) {
      const Tensor g = random_tensor({257}, 100 + static_cast<uint64_t>(step), 0.1f);
      cpu->adamw_step(cfg, step, p, g, m, v);
      const Tensor gg = on_device ? to_dev(*gpu, g) : g;
      gpu->adamw_step(cfg, step, gp, gg, gm, gv);
    }
    CHECK(rel_err(to_host(*gpu, gp), p) <= 1e-5);
    CHECK(rel_err(to_host(*gpu, gm), m) <= 1e-5);
    CHECK(rel_err(to_host(*gpu, gv), v) <= 1e-5);
  }
}
