// Tensor-parallel ops over a thread-simulated group of K ranks give the
// single-device result: outputs, input gradients, and each rank's parameter
// gradient equals its block of the unsplit gradient. Tolerance: 1e-5
// relative to max(1, largest magnitude) (fp32 reordering only).
// Also the fake communicators' closed-form results.
#include <catch2/catch.hpp>

#include <vector>

#include "helpers.h"
#include "libexec/comm/fake_comm.h"
#include "libexec/ops/op.h"

using namespace spindle::exec;
using spindle::exec::test::max_rel_diff;
using spindle::exec::test::perturb;
using spindle::exec::test::random_ids;
using spindle::exec::test::random_tensor;
using spindle::exec::test::shard_of;

namespace {

struct Result {
  Tensor out;
  std::vector<Tensor> grads;     // input gradients
  std::vector<Tensor> pgrads;    // parameter gradients (local blocks)
  std::vector<Tensor> init;      // parameter values as initialised (local blocks)
};

// Runs forward and backward of `cfg` with `comm` as TP group (nullptr: none),
// using the reference's parameter values (sliced to this rank's blocks).
Result run(OpConfig cfg, Comm* comm, const std::vector<Tensor>& in, const Tensor& dout,
           const ParamSet* ref) {
  cfg.use_tp(comm);
  ParamSet ps = make_params(cfg, "m/2.0", 13);
  Result r;
  for (size_t i = 0; i < ps.params.size(); ++i) {
    Param& p = ps.params[i];
    r.init.push_back(p.value.clone());
    if (ref) p.value = shard_of(ref->params[i].value, p.shard_axis, cfg.tp_rank, cfg.tp_size);
  }
  Op op = make_op(cfg, ps);
  r.out = op_forward(op, in);
  r.grads = op_backward(op, dout);
  for (Param& p : ps.params) r.pgrads.push_back(p.grad.clone());
  return r;
}

void check_tp(const OpConfig& cfg, const std::vector<Tensor>& in, int k) {
  // Reference: one device, perturbed parameters.
  ParamSet ref = make_params(cfg, "m/2.0", 13);
  const std::vector<Tensor> init_ref = [&] {
    std::vector<Tensor> v;
    for (Param& p : ref.params) v.push_back(p.value.clone());
    return v;
  }();
  perturb(ref, 17);
  Op probe = make_op(cfg, ref);
  const Tensor dout = random_tensor(op_forward(probe, in).shape(), 23);
  const Result one = run(cfg, nullptr, in, dout, &ref);

  std::vector<Result> ranks(static_cast<size_t>(k));
  run_thread_group(k, [&](Comm& c) { ranks[static_cast<size_t>(c.rank())] = run(cfg, &c, in, dout, &ref); });

  for (int t = 0; t < k; ++t) {
    INFO("TP " << k << " rank " << t);
    const Result& r = ranks[static_cast<size_t>(t)];
    CHECK(max_rel_diff(r.out, one.out) < 1e-5);
    REQUIRE(r.grads.size() == one.grads.size());
    for (size_t g = 0; g < r.grads.size(); ++g) CHECK(max_rel_diff(r.grads[g], one.grads[g]) < 1e-5);
    for (size_t i = 0; i < ref.params.size(); ++i) {
      const Param& p = ref.params[i];
      INFO(p.name);
      const Tensor want_grad = shard_of(one.pgrads[i], p.shard_axis, t, k);
      CHECK(max_rel_diff(r.pgrads[i], want_grad) < 1e-5);
      // Deterministic init: a shard is the block of the unsplit init.
      const Tensor want_init = shard_of(init_ref[i], p.shard_axis, t, k);
      CHECK(max_rel_diff(r.init[i], want_init) == 0.0);
    }
  }
}

}  // namespace

TEST_CASE("tensor-parallel transformer_layer equals the unsplit layer", "[tp]") {
  for (bool causal : {false, true}) {
    OpConfig cfg;
    cfg.kind = OpKind::transformer_layer;
    cfg.dims = {{"hidden", 8}, {"heads", 4}, {"ffn", 8}, {"causal", causal}};
    for (int k : {2, 4}) check_tp(cfg, {random_tensor({2, 3, 8}, 1)}, k);
  }
}

TEST_CASE("vocab-parallel lm_loss equals the unsplit loss", "[tp]") {
  OpConfig cfg;
  cfg.kind = OpKind::lm_loss;
  cfg.dims = {{"hidden", 6}, {"vocab", 8}};
  for (int k : {2, 4}) check_tp(cfg, {random_tensor({2, 3, 6}, 1), random_ids({2, 3}, 8, 5)}, k);
}

TEST_CASE("tensor parallel rejects sizes that do not divide", "[tp]") {
  std::vector<bool> threw(3, false);
  run_thread_group(3, [&](Comm& c) {
    OpConfig cfg;
    cfg.kind = OpKind::transformer_layer;
    cfg.dims = {{"hidden", 8}, {"heads", 4}, {"ffn", 8}};
    cfg.use_tp(&c);
    try {
      make_params(cfg, "m/0.0", 0);
    } catch (const std::invalid_argument&) {
      threw[static_cast<size_t>(c.rank())] = true;
    }
  });
  CHECK(threw == std::vector<bool>(3, true));
}

TEST_CASE("thread group: all_reduce, all_gather, send/recv closed forms", "[comm]") {
  for (int k : {1, 2, 3, 4}) {
    std::vector<std::vector<float>> reduced(static_cast<size_t>(k)), gathered(static_cast<size_t>(k)),
        received(static_cast<size_t>(k));
    run_thread_group(k, [&](Comm& c) {
      const int r = c.rank(), n = c.size();
      std::vector<float> a{1.0f, static_cast<float>(r)};
      c.all_reduce_sum(a);
      std::vector<float> g(static_cast<size_t>(2 * n));
      const std::vector<float> mine{static_cast<float>(r), static_cast<float>(10 * r)};
      c.all_gather(mine, g);
      // Ring: send own rank to the next, receive from the previous.
      std::vector<float> got(1);
      const std::vector<float> me{static_cast<float>(r)};
      c.send(me, (r + 1) % n, 3);
      c.recv(got, (r + n - 1) % n, 3);
      c.barrier();
      reduced[static_cast<size_t>(r)] = a;
      gathered[static_cast<size_t>(r)] = g;
      received[static_cast<size_t>(r)] = got;
    });
    for (int r = 0; r < k; ++r) {
      INFO("size " << k << " rank " << r);
      CHECK(reduced[static_cast<size_t>(r)] == std::vector<float>{float(k), float(k * (k - 1) / 2)});
      for (int q = 0; q < k; ++q) {
        CHECK(gathered[static_cast<size_t>(r)][static_cast<size_t>(2 * q)] == float(q));
        CHECK(gathered[static_cast<size_t>(r)][static_cast<size_t>(2 * q + 1)] == float(10 * q));
      }
      CHECK(received[static_cast<size_t>(r)][0] == float((r + k - 1) % k));
    }
  }
}

TEST_CASE("self comm: size 1, loopback send/recv", "[comm]") {
  SelfComm c;
  CHECK(c.size() == 1);
  std::vector<float> a{2, 3};
  c.all_reduce_sum(a);
  CHECK(a == std::vector<float>{2, 3});
  std::vector<float> g(2);
  c.all_gather(a, g);
  CHECK(g == a);
  c.send(a, 0, 1);
  std::vector<float> got(2);
  c.recv(got, 0, 1);
  CHECK(got == a);
  CHECK_THROWS(c.recv(got, 0, 1));
  CHECK_THROWS(c.send(a, 1, 0));
}
