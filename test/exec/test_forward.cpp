// Forward values computed by hand, AdamW steps, parameter counts, init.
#include <catch2/catch.hpp>

#include <cmath>

#include "helpers.h"
#include "libexec/backend/backend.h"
#include "libexec/ops/kernels.h"
#include "libexec/ops/op.h"
#include "libexec/optim/adamw.h"
#include "libplan/cost/analytic.h"

using namespace spindle::exec;
using spindle::exec::test::op_config;

namespace {
void set(ParamSet& ps, const std::string& tensor, std::vector<float> v) {
  Param& p = ps.get(tensor);
  p.value = Tensor::from(p.value.shape(), std::move(v));
}
}  // namespace

TEST_CASE("linear forward: y = x W + b on a 2x2 case", "[forward]") {
  OpConfig cfg = op_config(OpKind::linear, {{"in", 2}, {"out", 2}});
  ParamSet ps = make_params(cfg, "m/0.0", 0);
  set(ps, "w", {1, 2, 3, 4});  // [in, out]
  set(ps, "bias", {0.5f, -1});
  Op op = make_op(cfg, ps);
  const Tensor x = Tensor::from({1, 1, 2}, {1, 2});
  const Tensor y = op_forward(op, std::span(&x, 1));
  REQUIRE(y.shape() == Shape{1, 1, 2});
  CHECK(y[0] == Approx(1 * 1 + 2 * 3 + 0.5));
  CHECK(y[1] == Approx(1 * 2 + 2 * 4 - 1));
}

TEST_CASE("LayerNorm forward: [1, 3] normalises to [-1, 1] (eps 1e-5)", "[forward]") {
  LayerNormCache cache;
  const Tensor y = layernorm_forward(Tensor::from({1, 2}, {1, 3}), Tensor::from({2}, {2, 1}),
                                     Tensor::from({2}, {0, 1}), cache);
  const double r = 1.0 / std::sqrt(1.0 + 1e-5);  // mean 2, variance 1
  CHECK(y[0] == Approx(-2 * r).epsilon(1e-6));
  CHECK(y[1] == Approx(r + 1).epsilon(1e-6));
}

TEST_CASE("GELU (tanh approximation) at -1, 0, 1, 2", "[forward]") {
  CHECK(gelu(0.0f) == 0.0f);
  CHECK(gelu(1.0f) == Approx(0.8411919906082768).epsilon(1e-6));
  CHECK(gelu(-1.0f) == Approx(-0.15880800939172324).epsilon(1e-6));
  CHECK(gelu(2.0f) == Approx(1.954597694087775).epsilon(1e-6));
}

TEST_CASE("GELU on a tensor: each value as on its own, within 1e-6 of std::tanh's, gradient by differences",
          "[forward]") {
  // 37 values: whole vector packets and a tail, so a value computed in
  // either path must agree with the scalar one bit for bit (the rows a
  // device holds decide where a value sits in its tensor).
  std::vector<float> v;
  for (int i = 0; i < 37; ++i) v.push_back(-6.0f + 0.33f * static_cast<float>(i));
  const Tensor x = Tensor::from({37}, v);
  const Tensor y = gelu_forward(x);
  const Tensor dx = gelu_backward(x, Tensor::from({37}, std::vector<float>(37, 1.0f)));
  for (int i = 0; i < 37; ++i) {
    const float a = v[static_cast<size_t>(i)];
    REQUIRE(y[i] == gelu(a));
    REQUIRE(dx[i] == gelu_grad(a));
    const double t = std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a));
    CHECK(y[i] == Approx(0.5 * a * (1 + t)).margin(1e-6).epsilon(1e-6));
    const double h = 1e-3;
    const auto g = [](double u) {
      return 0.5 * u * (1 + std::tanh(0.7978845608028654 * (u + 0.044715 * u * u * u)));
    };
    CHECK(dx[i] == Approx((g(a + h) - g(a - h)) / (2 * h)).margin(1e-5).epsilon(1e-5));
  }
}

TEST_CASE("lm_loss forward: softmax cross-entropy on a 2-token, 2-word case", "[forward]") {
  // hidden 2: LayerNorm of [0, 2] is [-r, r] with r = 1/sqrt(1 + 1e-5);
  // W = identity gives logits [-r, r]. Targets 1 and 0:
  // CE = log(e^-r + e^r) -+ r, mean = log(e^-r + e^r).
  OpConfig cfg = op_config(OpKind::lm_loss, {{"hidden", 2}, {"vocab", 2}});
  ParamSet ps = make_params(cfg, "m/0.0", 0);
  set(ps, "w", {1, 0, 0, 1});
  Op op = make_op(cfg, ps);
  const std::vector<Tensor> in{Tensor::from({1, 2, 2}, {0, 2, 0, 2}), Tensor::from({1, 2}, {1, 0})};
  const Tensor loss = op_forward(op, in);
  const double r = 1.0 / std::sqrt(1.0 + 1e-5);
  CHECK(loss[0] == Approx(std::log(std::exp(-r) + std::exp(r))).epsilon(1e-6));
  CHECK(loss[0] == Approx(1.1269242031060018).epsilon(1e-6));
}

TEST_CASE("lm_loss forward: targets -1 are ignored, the mean is over the counted tokens", "[forward]") {
  // As above, token 0 with target 1: CE = log(e^-r + e^r) - r; token 1 ignored.
  OpConfig cfg = op_config(OpKind::lm_loss, {{"hidden", 2}, {"vocab", 2}});
  ParamSet ps = make_params(cfg, "m/0.0", 0);
  set(ps, "w", {1, 0, 0, 1});
  Op op = make_op(cfg, ps);
  const double r = 1.0 / std::sqrt(1.0 + 1e-5);
  const Tensor x = Tensor::from({1, 2, 2}, {0, 2, 0, 2});
  const std::vector<Tensor> one{x, Tensor::from({1, 2}, {1, -1})};
  CHECK(op_forward(op, one)[0] == Approx(std::log(std::exp(-r) + std::exp(r)) - r).epsilon(1e-5));
  CHECK(op_forward(op, one)[0] == Approx(0.12692920).epsilon(1e-5));
  // Every token ignored: loss 0 and no gradient anywhere.
  const std::vector<Tensor> none{x, Tensor::from({1, 2}, {-1, -1})};
  CHECK(op_forward(op, none)[0] == 0.0f);
  const std::vector<Tensor> dx = op_backward(op, Tensor::from({1}, {1.0f}));
  for (int64_t i = 0; i < dx[0].numel(); ++i) CHECK(dx[0][i] == 0.0f);
  for (const Param& p : ps.params)
    for (int64_t i = 0; i < p.grad.numel(); ++i) CHECK(p.grad[i] == 0.0f);
  // -2 is neither an id nor the ignore marker.
  const std::vector<Tensor> bad{x, Tensor::from({1, 2}, {1, -2})};
  CHECK_THROWS_AS(op_forward(op, bad), std::out_of_range);
}

namespace {
// One operator's forward and backward on the CPU backend against what
// memory_as_run counts for it (cost/analytic.h, RunActivation): what the
// forward leaves held at most what it keeps, its peak at most that and its
// transients, the backward's peak at most that and twice its transients
// (the count's backward working set). Bytes beyond the inputs, the
// parameters and their gradients, which the count has elsewhere.
void check_op_memory(const OpConfig& cfg, const std::vector<Tensor>& in, int64_t seq, int64_t rows) {
  ParamSet ps = make_params(cfg, "m/0.0", 0);
  Op op = make_op(cfg, ps);
  const spindle::plan::Workload w{op_name(cfg.kind), cfg.dims, seq, rows};
  const spindle::plan::RunActivation a = spindle::plan::analytic_run_activation(w);
  const double kept = static_cast<double>(rows) * (a.replicated + a.split);
  const double transient = static_cast<double>(rows) * (a.transient_replicated + a.transient_split);
  const int64_t base = host_tensor_bytes();
  reset_host_tensor_peak();
  const Tensor out = op_forward(op, in);
  // What it keeps and its output (a loss's scalar aside, which the count
  // leaves out).
  CHECK(static_cast<double>(host_tensor_bytes() - base) <= kept + (out.numel() == 1 ? 4 : 0));
  CHECK(static_cast<double>(host_tensor_peak_bytes() - base) <= kept + transient);
  const Tensor dy = Tensor::from(out.shape(), std::vector<float>(static_cast<size_t>(out.numel()), 1.0f));
  reset_host_tensor_peak();
  const std::vector<Tensor> dx = op_backward(op, dy);
  CHECK(static_cast<double>(host_tensor_peak_bytes() - base) <= kept + 2 * transient);
}
}  // namespace

TEST_CASE("lm_loss holds one [tokens, vocab] buffer: its peaks within what memory_as_run counts for it", "[forward]") {
  // 2 rows of 16 tokens, hidden 8, vocabulary 2048: the probabilities are
  // 32 x 2048 fp32, 256 KiB, and every other tensor of the operator a few
  // KiB. memory_as_run counts what it keeps (the probabilities among it)
  // and twice its transients, of the hidden width only: the logits become
  // the probabilities in place and backward makes dL/dlogits in their
  // buffer. A second vocabulary-wide tensor (a clone for dL/dlogits, or
  // logits and probabilities side by side) would be 256 KiB over.
  const int64_t rows = 2, seq = 16, hidden = 8, vocab = 2048;
  const spindle::plan::RunActivation a =
      spindle::plan::analytic_run_activation({"lm_loss", {{"hidden", hidden}, {"vocab", vocab}}, seq, rows});
  REQUIRE(static_cast<double>(rows * seq * vocab * 4) > 8 * rows * (a.transient_replicated + a.transient_split));
  std::vector<float> ids(static_cast<size_t>(rows * seq));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>((i * 37) % vocab);
  check_op_memory(op_config(OpKind::lm_loss, {{"hidden", hidden}, {"vocab", vocab}}),
                  {test::random_tensor({rows, seq, hidden}, 3), Tensor::from({rows, seq}, ids)}, seq, rows);
}

TEST_CASE("every operator's CPU peaks within what memory_as_run counts for it", "[forward]") {
  // Sequences of 17 (not a multiple of 8) and 5 rows.
  SECTION("transformer_layer") {
    for (bool causal : {false, true})
      check_op_memory(
          op_config(OpKind::transformer_layer, {{"hidden", 32}, {"heads", 4}, {"ffn", 64}, {"causal", causal}}),
          {test::random_tensor({5, 17, 32}, 1)}, 17, 5);
  }
  SECTION("linear") {
    check_op_memory(op_config(OpKind::linear, {{"in", 48}, {"out", 16}}), {test::random_tensor({5, 17, 48}, 1)}, 17, 5);
  }
  SECTION("patch_embed") {
    check_op_memory(op_config(OpKind::patch_embed, {{"in_dim", 24}, {"hidden", 32}}, 17),
                    {test::random_tensor({5, 17, 24}, 1)}, 17, 5);
  }
  SECTION("token_embed") {
    check_op_memory(op_config(OpKind::token_embed, {{"vocab", 50}, {"hidden", 32}}, 17),
                    {test::random_ids({5, 17}, 50, 3)}, 17, 5);
  }
  SECTION("pool_project: dL/dx over the whole sequence") {
    check_op_memory(op_config(OpKind::pool_project, {{"in", 32}, {"out", 16}}), {test::random_tensor({5, 17, 32}, 1)},
                    17, 5);
  }
  SECTION("contrastive_loss") {
    check_op_memory(op_config(OpKind::contrastive_loss, {{"dim", 16}, {"temperature", 0.07}}),
                    {test::random_tensor({5, 1, 16}, 1), test::random_tensor({5, 1, 16}, 2)}, 1, 5);
  }
  SECTION("lm_loss") {
    check_op_memory(op_config(OpKind::lm_loss, {{"hidden", 32}, {"vocab", 64}}),
                    {test::random_tensor({5, 17, 32}, 1), test::random_ids({5, 17}, 64, 3)}, 17, 5);
  }
}

TEST_CASE("contrastive_loss forward: symmetric InfoNCE on a 2x2 case", "[forward]") {
  // a = I, b = [[1,0],[1,1]] -> u = I, w = [[1,0],[s,s]], s = 1/sqrt(2).
  // logits (T = 1) = [[1, s], [0, s]].
  // rows: log(e + e^s) - 1, log(1 + e^s) - s; columns: log(e + 1) - 1, log 2.
  const double s = 1.0 / std::sqrt(2.0);
  const double rows = std::log(std::exp(1.0) + std::exp(s)) - 1 + std::log(1 + std::exp(s)) - s;
  const double cols = std::log(std::exp(1.0) + 1) - 1 + std::log(2.0);
  const double expected = 0.5 * (rows / 2 + cols / 2);
  CHECK(expected == Approx(0.4911570396112658));
  OpConfig cfg = op_config(OpKind::contrastive_loss, {{"dim", 2}, {"temperature", 1.0}});
  ParamSet ps = make_params(cfg, "c/0.0", 0);
  CHECK(ps.params.empty());
  Op op = make_op(cfg, ps);
  // Scaling an input row must not matter (L2 normalisation).
  const std::vector<Tensor> in{Tensor::from({2, 1, 2}, {3, 0, 0, 1}),
                               Tensor::from({2, 1, 2}, {1, 0, 2, 2})};
  CHECK(op_forward(op, in)[0] == Approx(expected).epsilon(1e-6));
  // Default temperature 0.07 when the dim is absent.
  OpConfig cfg2 = op_config(OpKind::contrastive_loss, {{"dim", 2}});
  Op op2 = make_op(cfg2, ps);
  CHECK(std::get<ContrastiveLossState>(op2.state).temperature == Approx(0.07));
}

TEST_CASE("patch_embed and token_embed add position rows 0..s-1", "[forward]") {
  OpConfig pc = op_config(OpKind::patch_embed, {{"in_dim", 1}, {"hidden", 1}}, 3);
  ParamSet pp = make_params(pc, "v/0.0", 0);
  set(pp, "w", {2});
  set(pp, "bias", {1});
  set(pp, "pos", {10, 20, 30});
  Op pop = make_op(pc, pp);
  const Tensor feats = Tensor::from({2, 2, 1}, {1, 2, 3, 4});
  const Tensor y = op_forward(pop, std::span(&feats, 1));
  CHECK(std::vector<float>(y.data(), y.data() + 4) == std::vector<float>{13, 25, 17, 29});

  OpConfig tc = op_config(OpKind::token_embed, {{"vocab", 3}, {"hidden", 1}}, 2);
  ParamSet tp = make_params(tc, "t/0.0", 0);
  set(tp, "table", {100, 200, 300});
  set(tp, "pos", {1, 2});
  Op top = make_op(tc, tp);
  const Tensor ids = Tensor::from({1, 2}, {2, 0});
  const Tensor e = op_forward(top, std::span(&ids, 1));
  CHECK(e[0] == 301);
  CHECK(e[1] == 102);
  const Tensor bad = Tensor::from({1, 1}, {3});
  CHECK_THROWS(op_forward(top, std::span(&bad, 1)));
}

TEST_CASE("pool_project forward: mean over s, then LayerNorm and linear", "[forward]") {
  OpConfig cfg = op_config(OpKind::pool_project, {{"in", 2}, {"out", 1}});
  ParamSet ps = make_params(cfg, "p/0.0", 0);
  set(ps, "w", {1, 2});
  set(ps, "bias", {0.25f});
  Op op = make_op(cfg, ps);
  // mean of [0, 0] and [2, 6] is [1, 3] -> LN [-r, r] -> -r + 2r + 0.25.
  const Tensor x = Tensor::from({1, 2, 2}, {0, 0, 2, 6});
  const Tensor y = op_forward(op, std::span(&x, 1));
  REQUIRE(y.shape() == Shape{1, 1, 1});
  CHECK(y[0] == Approx(1.0 / std::sqrt(1.0 + 1e-5) + 0.25).epsilon(1e-6));
}

TEST_CASE("AdamW: two hand-computed steps", "[adamw]") {
  // lr 0.1, wd 0.1, betas 0.9/0.999, eps 1e-8; p = 1, grads 0.5 then -0.25.
  // Step 1: p = 0.99 - 0.1 * 0.5 / 0.5 = 0.89.
  // Step 2: p = 0.8811 - 0.1 * (0.02/0.19) / sqrt(0.00031225/0.001999) = 0.854466...
  AdamWConfig cfg{0.1f, 0.9f, 0.999f, 1e-8f, 0.1f};
  Tensor p = Tensor::from({1}, {1}), m = Tensor::zeros({1}), v = Tensor::zeros({1});
  adamw_step(cfg, 1, p, Tensor::from({1}, {0.5f}), m, v);
  CHECK(p[0] == Approx(0.89).epsilon(1e-6));
  CHECK(m[0] == Approx(0.05));
  CHECK(v[0] == Approx(0.00025).epsilon(1e-4));  // 1 - 0.999f is 1.00005e-3 in fp32
  auto backend = make_backend("cpu");
  REQUIRE(backend);
  backend->adamw_step(cfg, 2, p, Tensor::from({1}, {-0.25f}), m, v);
  CHECK(p[0] == Approx(0.8544662986878463).epsilon(1e-6));
  CHECK_THROWS(adamw_step(cfg, 0, p, p, m, v));
}

TEST_CASE("cpu backend add: dst += src into a view, sizes checked", "[backend]") {
  auto backend = make_backend("cpu");
  REQUIRE(backend);
  Tensor dst = Tensor::from({2, 2}, {1, 2, 3, 4});
  Tensor tail = Tensor::wrap({2}, Device::host,
                             std::shared_ptr<float[]>(std::make_shared<Tensor>(dst), dst.data() + 2));
  backend->add(Tensor::from({2}, {0.5f, -4}), tail);
  CHECK(std::vector<float>(dst.data(), dst.data() + 4) == std::vector<float>{1, 2, 3.5f, 0});
  CHECK_THROWS_AS(backend->add(Tensor::from({3}, {1, 2, 3}), dst), std::invalid_argument);
}

TEST_CASE("cpu backend zero: a view's values set to 0 where they lie, the rest of its buffer untouched", "[backend]") {
  // Executor::zero_grads zeroes a bucket's gradients so: views of its flat
  // buffer, which must keep seeing that buffer (no new tensor).
  auto backend = make_backend("cpu");
  REQUIRE(backend);
  Tensor flat = Tensor::from({5}, {1, 2, 3, 4, 5});
  Tensor mid = Tensor::wrap({3}, Device::host, std::shared_ptr<float[]>(std::make_shared<Tensor>(flat), flat.data() + 1));
  const float* before = mid.data();
  backend->zero(mid);
  CHECK(mid.data() == before);
  CHECK(std::vector<float>(flat.data(), flat.data() + 5) == std::vector<float>{1, 0, 0, 0, 5});
}

TEST_CASE("parameter counts equal spec/model.md", "[params]") {
  const int64_t h = 8, f = 12, s = 5, in = 6, out = 4, v = 10;
  CHECK(make_params(op_config(OpKind::patch_embed, {{"in_dim", in}, {"hidden", h}}, s), "a/0.0", 0)
            .full_count() == in * h + h + s * h);
  CHECK(make_params(op_config(OpKind::token_embed, {{"vocab", v}, {"hidden", h}}, s), "a/0.0", 0)
            .full_count() == v * h + s * h);
  CHECK(make_params(op_config(OpKind::transformer_layer, {{"hidden", h}, {"heads", 2}, {"ffn", f}}),
                    "a/0.0", 0)
            .full_count() == 4 * h * h + 2 * h * f + f + 9 * h);
  CHECK(make_params(op_config(OpKind::linear, {{"in", in}, {"out", out}}), "a/0.0", 0).full_count() ==
        in * out + out);
  CHECK(make_params(op_config(OpKind::pool_project, {{"in", in}, {"out", out}}), "a/0.0", 0)
            .full_count() == in * out + out + 2 * in);
  CHECK(make_params(op_config(OpKind::lm_loss, {{"hidden", h}, {"vocab", v}}), "a/0.0", 0)
            .full_count() == h * v + 2 * h);
}

TEST_CASE("initialisation depends only on seed and parameter name", "[params]") {
  OpConfig cfg = op_config(OpKind::linear, {{"in", 4}, {"out", 3}});
  const ParamSet a = make_params(cfg, "m/1.0", 3), b = make_params(cfg, "m/1.0", 3);
  const ParamSet c = make_params(cfg, "m/1.1", 3), d = make_params(cfg, "m/1.0", 4);
  const Tensor& wa = a.params[0].value;
  CHECK(std::equal(wa.data(), wa.data() + wa.numel(), b.params[0].value.data()));
  CHECK_FALSE(std::equal(wa.data(), wa.data() + wa.numel(), c.params[0].value.data()));
  CHECK_FALSE(std::equal(wa.data(), wa.data() + wa.numel(), d.params[0].value.data()));
  for (int64_t i = 0; i < wa.numel(); ++i) CHECK(std::abs(wa[i]) <= 0.5f);  // 1/sqrt(in)
}

TEST_CASE("initialisation does not depend on how many threads seed it, TP shards too", "[params]") {
  // A TP-2 layer: row-sharded and column-sharded weights, replicated
  // LayerNorm gains, odd element counts cut unevenly over 3 and 7 threads.
  for (int rank : {0, 1}) {
    OpConfig cfg = op_config(OpKind::transformer_layer, {{"hidden", 12}, {"heads", 2}, {"ffn", 14}, {"causal", true}});
    cfg.tp_rank = rank;   // shapes only (make_params needs no communicator)
    cfg.tp_size = 2;
    const ParamSet one = make_params(cfg, "m/2.0", 9, 1);
    for (int threads : {3, 7}) {
      const ParamSet many = make_params(cfg, "m/2.0", 9, threads);
      REQUIRE(many.params.size() == one.params.size());
      for (size_t i = 0; i < one.params.size(); ++i) {
        INFO(one.params[i].name << " on " << threads << " threads, TP rank " << rank);
        const Tensor& a = one.params[i].value;
        const Tensor& b = many.params[i].value;
        REQUIRE(a.shape() == b.shape());
        CHECK(std::equal(a.data(), a.data() + a.numel(), b.data()));
      }
    }
  }
}

TEST_CASE("op kinds round-trip their catalogue names", "[ops]") {
  for (const char* n : {"patch_embed", "token_embed", "transformer_layer", "linear", "pool_project",
                        "contrastive_loss", "lm_loss"}) {
    auto k = op_kind(n);
    REQUIRE(k);
    CHECK(std::string(op_name(*k)) == n);
  }
  CHECK_FALSE(op_kind("conv2d"));
  CHECK(make_backend("cpu"));
  CHECK_FALSE(make_backend("tpu"));
}

TEST_CASE("tensor helpers: slice and concatenate rows, shared storage", "[tensor]") {
  Tensor t = Tensor::from({3, 2}, {0, 1, 2, 3, 4, 5});
  Tensor mid = slice_rows(t, 1, 2);
  CHECK(std::vector<float>(mid.data(), mid.data() + 4) == std::vector<float>{2, 3, 4, 5});
  Tensor back = concat_rows({slice_rows(t, 0, 1), mid});
  CHECK(std::equal(back.data(), back.data() + 6, t.data()));
  Tensor alias = t.reshaped({6});
  alias[0] = 9;
  CHECK(t[0] == 9);
  Tensor copy = t.clone();
  copy[0] = 1;
  CHECK(t[0] == 9);
  CHECK_THROWS(Tensor::from({2}, {1}));
  CHECK_THROWS(t.reshaped({4}));
}
