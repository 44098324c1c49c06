// The executor with the fake communicator (one device, SelfComm): training
// on the synthetic data lowers the loss; plus the synthetic data's
// independence from how rows are split (row arithmetic: test/plan/rules).
// The multi-rank equivalence runs under mpirun (test/exec/mpi/run_checks.sh).
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "libexec/backend/backend.h"
#include "libexec/comm/fake_comm.h"
#include "libexec/exec/data.h"
#include "libexec/rng.h"
#include "helpers.h"
#include "libexec/exec/executor.h"
#include "fixtures.h"
#include "libplan/graph/op_graph.h"

using namespace spindle::exec;
using spindle::exec::test::one_device_plan;
using spindle::exec::test::OneDevice;
namespace sp = spindle::plan;

namespace {



double total(const StepStats& s) {
  double t = 0;
  for (double l : s.task_loss) t += l;
  return t;
}

}  // namespace

TEST_CASE("communicator: posted messages of the thread group match by tag, in any order of posting and waiting") {
  // Three ranks each post two sends to each other before any receive,
  // receive them in the other order of tags and wait for them backwards
  // (the default post_send/post_recv of Comm on the fakes' buffered sends).
  std::vector<std::vector<float>> got(3);
  run_thread_group(3, [&](Comm& c) {
    const int r = c.rank();
    auto tag = [](int from, int to, int k) { return 100 * from + 10 * to + k; };
    std::vector<std::vector<float>> out;
    std::vector<int> sends;
    out.reserve(4);
    for (int q = 0; q < 3; ++q)
      for (int k = 0; q != r && k < 2; ++k) {
        out.push_back({static_cast<float>(tag(r, q, k)), 1.0f});
        sends.push_back(c.post_send(out.back(), q, tag(r, q, k)));
      }
    std::vector<float>& in = got[static_cast<size_t>(r)];
    in.assign(8, -1.0f);
    std::vector<int> recvs;
    size_t at = 0;
    for (int q = 0; q < 3; ++q)
      for (int k = 1; q != r && k >= 0; --k, at += 2)
        recvs.push_back(c.post_recv(std::span(in).subspan(at, 2), q, tag(q, r, k)));
    for (size_t i = recvs.size(); i-- > 0;) c.wait_p2p(recvs[i]);
    for (int s : sends) c.wait_p2p(s);
  });
  // Rank 1 received from 0 (k = 1, 0), then from 2 (k = 1, 0).
  CHECK(got[1] == std::vector<float>{11, 1, 10, 1, 211, 1, 210, 1});
  CHECK(got[0] == std::vector<float>{101, 1, 100, 1, 201, 1, 200, 1});
  CHECK(got[2] == std::vector<float>{21, 1, 20, 1, 121, 1, 120, 1});
  // A request waited for twice is a bug, reported.
  SelfComm self;
  std::vector<float> x{1}, y{0};
  const int s = self.post_send(x, 0, 3);
  const int r = self.post_recv(y, 0, 3);
  self.wait_p2p(r);
  CHECK(y[0] == 1);
  CHECK_THROWS(self.wait_p2p(r));
  self.wait_p2p(s);
}

TEST_CASE("data: a sample depends on (seed, task, index), not on how rows are split") {
  const SampleRange all{7, "image-text", 0, 8}, part{7, "image-text", 2, 3};
  const Tensor f_all = synth_features(all, "img", "vision", 5, 6), f_part = synth_features(part, "img", "vision", 5, 6);
  const Tensor t_all = synth_tokens(all, "text", 4, 64), t_part = synth_tokens(part, "text", 4, 64);
  for (int64_t i = 0; i < f_part.numel(); ++i) REQUIRE(f_part[i] == f_all[2 * 30 + i]);
  for (int64_t i = 0; i < t_part.numel(); ++i) REQUIRE(t_part[i] == t_all[2 * 4 + i]);
  for (int64_t i = 0; i < t_all.numel(); ++i) REQUIRE((t_all[i] >= 0 && t_all[i] < 64));
  // Another seed, other data.
  const Tensor other = synth_features({8, "image-text", 0, 8}, "img", "vision", 5, 6);
  CHECK(other[0] != f_all[0]);
}

TEST_CASE("data: the values do not depend on how many threads draw them") {
  // 7 rows over 1, 2, 3 and 16 threads (more threads than rows): uneven
  // cuts, and the projection (seq x in_dim x kLatentDim values) cut too.
  const SampleRange s{11, "caption", 5, 7};
  const Tensor f1 = synth_features(s, "img", "vision", 9, 10, 1);
  const Tensor t1 = synth_tokens(s, "text", 13, 50, 1), y1 = synth_targets(s, "trunk", 13, 50, 1);
  for (int threads : {2, 3, 16}) {
    INFO(threads << " threads");
    const Tensor f = synth_features(s, "img", "vision", 9, 10, threads);
    const Tensor t = synth_tokens(s, "text", 13, 50, threads), y = synth_targets(s, "trunk", 13, 50, threads);
    REQUIRE(f.shape() == f1.shape());
    REQUIRE(t.shape() == t1.shape());
    REQUIRE(y.shape() == y1.shape());
    for (int64_t i = 0; i < f.numel(); ++i) REQUIRE(f[i] == f1[i]);
    for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(t[i] == t1[i]);
    for (int64_t i = 0; i < y.numel(); ++i) REQUIRE(y[i] == y1[i]);
  }
  CHECK(host_threads_for(Device::host, 16, 2) == 1);
  CHECK(host_threads_for(Device::cuda, 16, 2) == 8);
  CHECK(host_threads_for(Device::cuda, 16, 32) == 1);
  CHECK(host_threads_for(Device::cuda, 0, 0) == 1);
}

TEST_CASE("data: features are the formula of data.h, value by value") {
  // x[t, c] = tanh(P_M[t, c] . z / sqrt(L)) + 0.1 noise, every normal drawn
  // here one by one from its (seed, stream, index) as data.h states.
  const SampleRange s{5, "audio-image", 3, 2};
  const int64_t seq = 3, in_dim = 4, per_row = seq * in_dim;
  const Tensor f = synth_features(s, "img", "vision", seq, in_dim);
  REQUIRE(f.numel() == s.rows * per_row);
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t e = 0; e < per_row; ++e) {
      float u = 0;
      for (int l = 0; l < kLatentDim; ++l)
        u += normal01(s.seed, hash_name("data/features/vision"), e * kLatentDim + l) *
             normal01(s.seed, hash_name("data/latent/audio-image"), (s.first_sample + r) * kLatentDim + l);
      const float want = std::tanh(u / std::sqrt(static_cast<float>(kLatentDim))) +
                         0.1f * normal01(s.seed, hash_name("data/noise/audio-image/img"), (s.first_sample + r) * per_row + e);
      REQUIRE(f[r * per_row + e] == want);
    }
}

TEST_CASE("executor: one device with SelfComm trains tiny-clip, loss falls over 20 steps") {
  const sp::Model model = spindle::exec::test::shipped_model("tiny-clip");
  const sp::Plan plan = one_device_plan(model);
  REQUIRE(Executor::device_groups(model, plan) == std::vector<std::vector<int>>{{0}});
  ExecOptions opts;
  opts.record_trace = true;
  OneDevice one(model, plan, opts);
  Executor& ex = *one.ex;
  std::vector<double> losses;
  for (int s = 0; s < 20; ++s) {
    const StepStats st = ex.step();
    REQUIRE(st.task_loss.size() == model.tasks.size());
    losses.push_back(total(st));
  }
  INFO("first " << losses.front() << ", last " << losses.back());
  CHECK(losses.back() < 0.7 * losses.front());
  CHECK((losses[17] + losses[18] + losses[19]) / 3 < (losses[0] + losses[1] + losses[2]) / 3);
  // Trace: compute boxes for every slice forward and backward, every step.
  const std::vector<sp::TraceEvent> trace = ex.trace();
  size_t compute = 0;
  for (const auto& e : trace) compute += e.cat == "compute" ? 1 : 0;
  CHECK(compute == 20 * (2 * plan.waves.size() + 1));  // + the optimizer box
  // Each box is named and given its args from its compact record
  // (Executor::trace): a slice's boxes by its operator, count, MetaOp, wave
  // and rows (here the task's whole batch), every box by its step (1-20, as
  // --metrics counts them), in order.
  std::vector<std::string> want, got;
  for (int64_t step = 1; step <= 20; ++step) {
    // One device runs its waves' forwards in order, their backwards in
    // reverse, then the optimizer.
    for (const char* dir : {"fwd ", "bwd "})
      for (size_t k = 0; k < plan.waves.size(); ++k) {
        const sp::Wave& w = plan.waves[dir[0] == 'f' ? k : plan.waves.size() - 1 - k];
        const sp::Slice& sl = w.slices.front();
        const sp::PlanMetaOp& m = plan.metaops[static_cast<size_t>(sl.metaop)];
        int64_t batch = 0;
        for (const sp::Task& t : model.tasks) batch = t.name == m.task ? t.batch : batch;
        want.push_back(dir + m.operators[static_cast<size_t>(sl.first)] + " x1 metaop " + std::to_string(m.id) +
                       " wave " + std::to_string(w.index) + " rows " + std::to_string(batch) + " step " +
                       std::to_string(step));
      }
    want.push_back("optimizer step " + std::to_string(step));
  }
  double last_start = -1;
  for (const auto& e : trace) {
    CHECK(e.device == 0);
    CHECK(e.dur_us >= 0);
    CHECK(e.start_us >= last_start);
    last_start = e.start_us;
    if (e.cat != "compute") {
      // The one device's exchanges (no transfers: its own rows), on the
      // communication track, by wave.
      CHECK(e.track == 1);
      CHECK(e.cat == "transfer");
      const std::string dir = e.name.starts_with("transfer fwd") ? "fwd" : "bwd";
      CHECK(e.name == "transfer " + dir + " wave " + e.args.at("wave").dump());
      continue;
    }
    CHECK(e.track == 0);
    if (e.name == "optimizer") {
      got.push_back("optimizer step " + std::to_string(e.args.at("step").get<int64_t>()));
      continue;
    }
    got.push_back(e.name + " metaop " + e.args.at("metaop").dump() + " wave " + e.args.at("wave").dump() +
                  " rows " + e.args.at("rows").dump() + " step " + e.args.at("step").dump());
  }
  CHECK(got == want);
  // Parameters: every tensor of the model, full shapes.
  const auto params = ex.gather_params();
  int64_t count = 0;
  for (const auto& [name, t] : params) count += t.numel();
  CHECK(count == model.parameter_count());
}

TEST_CASE("executor: a trace window keeps the boxes of its steps alone (ExecOptions::trace_first_step, _last_step)") {
  const sp::Model model = spindle::exec::test::shipped_model("tiny-clip");
  const sp::Plan plan = one_device_plan(model);
  auto boxes_by_step = [&](int64_t first, int64_t last) {
    ExecOptions opts;
    opts.record_trace = true;
    opts.trace_first_step = first;
    opts.trace_last_step = last;
    OneDevice one(model, plan, opts);
    for (int s = 0; s < 6; ++s) one.ex->step();
    std::map<int64_t, size_t> by_step;
    for (const sp::TraceEvent& e : one.ex->trace()) ++by_step[e.args.at("step").get<int64_t>()];
    return by_step;
  };
  // Every step: each with the same boxes (one device, the same program).
  const std::map<int64_t, size_t> all = boxes_by_step(1, std::numeric_limits<int64_t>::max());
  REQUIRE(all.size() == 6);
  const size_t per_step = all.at(1);
  CHECK(per_step >= 2 * plan.waves.size() + 1);
  for (const auto& [step, n] : all) CHECK(n == per_step);
  // Steps 3 to 5 only; step 6 alone; a window past the run keeps nothing.
  CHECK(boxes_by_step(3, 5) == std::map<int64_t, size_t>{{3, per_step}, {4, per_step}, {5, per_step}});
  CHECK(boxes_by_step(6, 6) == std::map<int64_t, size_t>{{6, per_step}});
  CHECK(boxes_by_step(7, 9).empty());
}

TEST_CASE("executor: the same seed gives the same losses, another seed others") {
  const sp::Model model = spindle::exec::test::shipped_model("tiny-clip");
  const sp::Plan plan = one_device_plan(model);
  auto run = [&](uint64_t seed) {
    ExecOptions opts;
    opts.seed = seed;
    OneDevice one(model, plan, opts);
    std::vector<double> l;
    for (int s = 0; s < 3; ++s) l.push_back(total(one.ex->step()));
    return l;
  };
  CHECK(run(1) == run(1));
  CHECK(run(1) != run(2));
}

TEST_CASE("executor: a plan for another world size is rejected") {
  const sp::Model model = spindle::exec::test::shipped_model("tiny-clip");
  sp::Plan plan = one_device_plan(model);
  plan.devices = 2;
  SelfComm world;
  auto backend = make_backend("cpu");
  CHECK_THROWS_AS(Executor(model, plan, world, GroupComms{}, *backend, ExecOptions{}), std::invalid_argument);
}

TEST_CASE("tensor: host tensor bytes count from allocation to the last handle's release, with a resettable peak") {
  // Deltas from what this process holds already (other tests' tensors).
  const int64_t base = spindle::exec::host_tensor_bytes();
  spindle::exec::reset_host_tensor_peak();
  CHECK(spindle::exec::host_tensor_peak_bytes() == base);
  {
    Tensor a = Tensor::zeros({3, 5});                 // 15 floats: 60 bytes
    CHECK(spindle::exec::host_tensor_bytes() == base + 60);
    Tensor view = a.reshaped({5, 3});                 // the same storage: no bytes
    Tensor copy = a.clone();                          // 60 more
    Tensor empty = Tensor::zeros({0, 4});             // holds one float (never 0 bytes): 4
    CHECK(spindle::exec::host_tensor_bytes() == base + 124);
    a = Tensor();                                     // `view` still holds the storage
    CHECK(spindle::exec::host_tensor_bytes() == base + 124);
    view = Tensor();                                  // the last handle: 60 released
    CHECK(spindle::exec::host_tensor_bytes() == base + 64);
    CHECK(spindle::exec::host_tensor_peak_bytes() == base + 124);
    spindle::exec::reset_host_tensor_peak();          // the peak restarts at what is held: base + 64
    Tensor big = Tensor::from({2, 2}, {1, 2, 3, 4});  // 16 more
    big = Tensor();
    CHECK(spindle::exec::host_tensor_peak_bytes() == base + 80);
  }
  CHECK(spindle::exec::host_tensor_bytes() == base);
  CHECK(spindle::exec::host_tensor_peak_bytes() == base + 80);
}

TEST_CASE("executor: a step's peak_bytes holds at least every parameter, its gradient and AdamW's moments") {
  const sp::Model model = spindle::exec::test::shipped_model("tiny-clip");
  const sp::Plan plan = one_device_plan(model);
  const int64_t before = spindle::exec::host_tensor_bytes();
  OneDevice one(model, plan, ExecOptions{});
  Executor& ex = *one.ex;
  ex.step();
  const StepStats st = ex.step();   // the moments exist from the first step on
  const int64_t after = spindle::exec::host_tensor_bytes() - before;
  // The peak is the backend's (host tensors on the CPU) during that step.
  CHECK(st.counters.peak_bytes == one.backend->peak_bytes());
  int64_t values = 0;
  for (const auto& [name, t] : ex.gather_params()) values += t.numel();
  // What the executor allocated against the model's own count (the
  // catalogue's formulas, libplan): value, gradient and two moments of 4
  // bytes each, all on the one device.
  REQUIRE(values == model.parameter_count());
  REQUIRE(values > 0);
  CHECK(st.counters.peak_bytes >= 16 * values);
  // Between steps it holds the parameter state alone: no activation, saved
  // tensor or message buffer of the step outlives it.
  CHECK(after == 16 * values);
  CHECK(st.counters.peak_bytes < 64 * 1024 * 1024);
}
