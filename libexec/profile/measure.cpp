#include "libexec/profile/measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <stdexcept>

#include <unistd.h>

#include "libexec/exec/data.h"
#include "libexec/ops/op.h"
#include "libexec/rng.h"
#include "libplan/cost/cost_model.h"
#include "libplan/model/ops.h"
#include "libplan/rules/memory.h"
#include "libplan/util/parallel.h"

namespace spindle::exec {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A TP group of K ranks seen from rank 0 that records the collectives it is
// asked for instead of performing them: all_reduce_sum leaves the data as it
// is, all_gather replicates this rank's block. The timing stays that of the
// shard's compute; op_comm_ms adds the communication.
class RecordingComm final : public Comm {
 public:
  explicit RecordingComm(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  void all_reduce_sum(std::span<float> data) override {
    calls.allreduce_floats.push_back(static_cast<int64_t>(data.size()));
  }
  void all_gather(std::span<const float> send, std::span<float> recv) override {
    calls.allgather_floats.push_back(static_cast<int64_t>(send.size()));
    for (int r = 0; r < size_; ++r) std::copy(send.begin(), send.end(), recv.begin() + r * static_cast<std::ptrdiff_t>(send.size()));
  }
  void send(std::span<const float>, int, int) override { fail(); }
  void recv(std::span<float>, int, int) override { fail(); }
  void barrier() override {}

  TpCalls calls;

 private:
  [[noreturn]] static void fail() { throw std::logic_error("profiling: an operator sent point-to-point inside its TP group"); }
  int size_;
};

// Host tensor of `shape` with values uniform in [-1, 1) from (seed, stream),
// drawn on `threads` threads (the values do not depend on it).
Tensor random_tensor(const Shape& shape, uint64_t seed, uint64_t stream, int threads) {
  Tensor t = Tensor::zeros(shape);
  plan::parallel_ranges(t.numel(), threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) t[i] = uniform_pm1(seed, stream, i);
  });
  return t;
}

// Host tensor of `shape` holding integers in 0..limit-1 (token ids, targets).
Tensor random_ids(const Shape& shape, int64_t limit, uint64_t seed, uint64_t stream, int threads) {
  Tensor t = Tensor::zeros(shape);
  plan::parallel_ranges(t.numel(), threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const double u = 0.5 * (uniform_pm1(seed, stream, i) + 1.0);
      t[i] = static_cast<float>(std::min<int64_t>(limit - 1, static_cast<int64_t>(u * static_cast<double>(limit))));
    }
  });
  return t;
}

int64_t dim(const plan::Workload& w, const char* name) { return w.dims.at(name).get<int64_t>(); }

// The host inputs of one forward on `rows` rows (ops/op.h's table).
std::vector<Tensor> make_inputs(const plan::Workload& w, int64_t rows, uint64_t seed, int threads) {
  const int64_t s = w.seq;
  const uint64_t stream = hash_name("profile/" + w.key());
  if (w.op == "patch_embed") return {random_tensor({rows, s, dim(w, "in_dim")}, seed, stream, threads)};
  if (w.op == "token_embed") return {random_ids({rows, s}, dim(w, "vocab"), seed, stream, threads)};
  if (w.op == "contrastive_loss") {
    const int64_t d = dim(w, "dim");
    return {random_tensor({rows, 1, d}, seed, stream, threads), random_tensor({rows, 1, d}, seed, stream + 1, threads)};
  }
  const int64_t width = plan::op_in_width(w.op, w.dims);
  if (w.op == "lm_loss")
    return {random_tensor({rows, s, width}, seed, stream, threads),
            random_ids({rows, s}, dim(w, "vocab"), seed, stream + 1, threads)};
  return {random_tensor({rows, s, width}, seed, stream, threads)};
}

Tensor to_backend(Backend& backend, const Tensor& host) {
  Tensor t = backend.allocate(host.shape());
  backend.copy(host, t);
  return t;
}

// Repetitions both sides of a collective agree on: rank 0 proposes from its
// calibration time, everyone gets it through one all-reduce.
int agree_repeats(Comm& comm, double one_ms, const MeasureOptions& o) {
  float reps = 0;
  if (comm.rank() == 0) {
    const double want = one_ms > 0 ? o.link_budget_ms / one_ms : o.max_repeats;
    reps = static_cast<float>(std::clamp(static_cast<int>(want), o.min_repeats, o.max_repeats));
  }
  comm.all_reduce_sum({&reps, 1});
  return static_cast<int>(reps);
}

std::string short_name(const plan::Workload& w) {
  std::string s = w.op + " seq " + std::to_string(w.seq) + " batch " + std::to_string(w.batch);
  for (const char* d : {"hidden", "dim", "in_dim", "in", "out"})
    if (w.dims.contains(d)) {
      s += std::string(" ") + d + " " + w.dims.at(d).dump();
      break;
    }
  return s;
}

}  // namespace

plan::Result<std::vector<MeasureTarget>> measure_targets(const plan::Model& model, const plan::OpGraph& graph,
                                                         const plan::Profile& skeleton) {
  std::map<std::string, MeasureTarget> by_key;
  for (const plan::Operator& op : graph.ops) {
    const plan::Task& task = model.tasks.at(static_cast<size_t>(op.task));
    const plan::Module* m = model.find_module(task.nodes.at(static_cast<size_t>(op.node)).module);
    auto [it, fresh] = by_key.try_emplace(op.workload.key());
    if (fresh) {
      it->second.workload = op.workload;
      it->second.tensor_parallel = op.tensor_parallel;
    }
    if (m) it->second.max_seq = std::max(it->second.max_seq, m->max_seq);
  }
  std::vector<MeasureTarget> out;
  for (const plan::ProfileEntry& e : skeleton.entries) {
    const auto it = by_key.find(e.workload.key());
    if (it == by_key.end())
      return plan::Error{"profile entry " + e.workload.key() + " is not a workload of model " + model.name};
    MeasureTarget t = it->second;
    t.max_seq = std::max(t.max_seq, t.workload.seq);
    for (const plan::ProfilePoint& p : e.points) {
      t.counts.push_back(p.devices);
      t.analytic_ms.push_back(p.ms);
    }
    out.push_back(std::move(t));
  }
  return out;
}

double expected_point_ms(double run_ms, const MeasureOptions& o) {
  if (!(run_ms > 0)) return 0;
  const double to_budget = std::ceil(o.point_budget_ms / run_ms);   // runs until the budget is spent
  const double timed = std::max<double>(o.min_repeats, std::min<double>(o.max_repeats, to_budget));
  return run_ms * (o.warmup + timed);
}

OpTiming time_operator(const MeasureTarget& t, int n, Backend& backend, const MeasureOptions& o) {
  const plan::Workload& w = t.workload;
  const int k = std::max(t.tensor_parallel, 1);
  const bool full_batch = plan::op_needs_whole_batch(w.op);
  const int64_t rows = full_batch ? w.batch : w.batch * k / n;
  if (rows <= 0) throw std::invalid_argument("profiling " + w.key() + ": no rows on " + std::to_string(n) + " devices");

  RecordingComm tp(k);
  OpConfig cfg;
  cfg.kind = op_kind(w.op).value();
  cfg.dims = w.dims;
  cfg.max_seq = t.max_seq;
  cfg.use_tp(k > 1 ? &tp : nullptr);
  ParamSet params = make_params(cfg, "profile/" + w.op, o.seed, o.host_threads);
  for (Param& p : params.params) {   // parameters live on the device, as in a run
    p.value = to_backend(backend, p.value);
    p.grad = to_backend(backend, p.grad);
  }
  Op op = make_op(cfg, params);

  std::vector<Tensor> inputs;
  for (const Tensor& h : make_inputs(w, rows, o.seed, o.host_threads)) inputs.push_back(to_backend(backend, h));
  const bool loss = plan::find_op(w.op)->is_loss;
  // Data readers draw their batch inside spindle-run's forward (exec/data.h):
  // that is part of the operator's time there, so it is here too.
  const bool reader = plan::op_reads_from_data(w.op);
  int64_t drawn = 0;   // samples drawn so far: each run draws fresh ones
  auto synthesise = [&]() {
    const SampleRange range{o.seed, "profile", drawn, rows};
    drawn += rows;
    if (w.op == "patch_embed")
      inputs[0] = to_backend(backend, synth_features(range, "profile", "profile", w.seq, dim(w, "in_dim"),
                                                     o.host_threads));
    else if (w.op == "token_embed")
      inputs[0] = to_backend(backend, synth_tokens(range, "profile", w.seq, dim(w, "vocab"), o.host_threads));
    else
      inputs[1] = to_backend(backend, synth_targets(range, "profile", w.seq, dim(w, "vocab"), o.host_threads));
  };
  Tensor dy;
  // One forward + backward; returns the forward's ms (the data drawn with it).
  auto run_once = [&]() {
    const Clock::time_point t0 = Clock::now();
    if (reader && o.include_data) synthesise();
    Tensor y = backend.forward(op, inputs);
    backend.synchronize();
    const double forward_ms = ms_since(t0);
    if (dy.empty())
      dy = to_backend(backend, loss ? Tensor::from({1}, {1.0f})
                                    : random_tensor(y.shape(), o.seed, hash_name("dy"), o.host_threads));
    std::vector<Tensor> dx = backend.backward(op, dy);
    backend.synchronize();
    return forward_ms;
  };

  for (int i = 0; i < o.warmup; ++i) run_once();
  OpTiming timing;
  std::vector<double> samples;
  double spent_ms = 0;
  while (static_cast<int>(samples.size()) < o.min_repeats ||
         (spent_ms < o.point_budget_ms && static_cast<int>(samples.size()) < o.max_repeats)) {
    tp.calls = {};
    const Clock::time_point t0 = Clock::now();
    timing.forward_samples_ms.push_back(run_once());
    const double ms = ms_since(t0);
    samples.push_back(ms);
    spent_ms += ms;
  }
  timing.compute_ms = timing_stats(samples);
  timing.repeats = static_cast<int>(samples.size());
  timing.samples_ms = std::move(samples);
  timing.tp = tp.calls;   // of the last run: one forward + backward
  return timing;
}

double op_comm_ms(const MeasureTarget& t, int n, const TpCalls& tp, const plan::Cluster& links) {
  // The runtime exchanges fp32 whatever the model's dtype (tensor.h).
  constexpr double kFloatBytes = plan::kWireBytesPerValue;
  double ms = 0;
  const int k = std::max(t.tensor_parallel, 1);
  if (k > 1) {
    const std::vector<int> group = plan::first_devices(k);
    for (int64_t f : tp.allreduce_floats) ms += plan::ring_allreduce_ms(links, static_cast<double>(f) * kFloatBytes, group);
    // A TP all-gather: each rank's f floats from every rank.
    for (int64_t f : tp.allgather_floats) ms += plan::ring_allgather_ms(links, static_cast<double>(f) * kFloatBytes * k, group);
  }
  if (plan::op_needs_whole_batch(t.workload.op) && n > 1) {
    // Both embeddings [batch / n, dim] gathered over the slice's n devices.
    const double bytes = static_cast<double>(t.workload.batch / n * dim(t.workload, "dim")) * kFloatBytes;
    ms += 2.0 * plan::ring_allgather_ms(links, bytes * n, plan::first_devices(n));
  }
  return ms;
}

std::vector<double> link_message_sizes(const std::vector<MeasureTarget>& targets,
                                       const std::vector<plan::ProfileEntry>& entries, plan::DType dtype,
                                       int count) {
  double lo = 0, hi = 0;
  auto take = [&](double b) {
    if (!(b > 0)) return;
    lo = lo > 0 ? std::min(lo, b) : b;
    hi = std::max(hi, b);
  };
  const double dt = plan::dtype_bytes(dtype);
  for (size_t i = 0; i < targets.size() && i < entries.size(); ++i) {
    const MeasureTarget& t = targets[i];
    take(static_cast<double>(entries[i].param_bytes) / std::max(t.tensor_parallel, 1));
    const double row =
        static_cast<double>(plan::op_out_values_per_sample(t.workload.op, t.workload.dims, t.workload.seq)) * dt;
    for (int n : t.counts) take(row * static_cast<double>(t.workload.batch) / n);
  }
  if (!(hi > 0)) lo = hi = 1 << 20;
  lo = std::max(lo, 4.0);
  hi = std::max({hi, 4.0 * lo, kMinLargestLinkMessage});   // distinct sizes; a bandwidth-bound largest
  std::vector<double> sizes;
  count = std::max(count, 2);
  for (int i = 0; i < count; ++i) {
    const double b = lo * std::pow(hi / lo, static_cast<double>(i) / (count - 1));
    const double rounded = std::max(4.0, 4.0 * std::round(b / 4.0));
    if (sizes.empty() || rounded > sizes.back()) sizes.push_back(rounded);
  }
  return sizes;
}

// Times a link's send/recv is measured when its fit is not physical.
constexpr int kLinkAttempts = 3;

LinkSamples time_p2p(Comm& comm, int a, int b, const std::vector<double>& sizes, const MeasureOptions& o) {
  LinkSamples out;
  const int me = comm.rank();
  for (double bytes : sizes) {
    std::vector<float> buf(static_cast<size_t>(bytes / 4.0), 1.0f);
    auto round_trip = [&]() {
      if (me == a) {
        comm.send(buf, b, 0);
        comm.recv(buf, b, 0);
      } else if (me == b) {
        comm.recv(buf, a, 0);
        comm.send(buf, a, 0);
      }
    };
    comm.barrier();
    Clock::time_point t0 = Clock::now();
    for (int i = 0; i < 3; ++i) round_trip();   // warm-up and calibration
    const int reps = agree_repeats(comm, ms_since(t0) / 3.0, o);
    std::vector<double> samples;
    for (int i = 0; i < reps; ++i) {
      t0 = Clock::now();
      round_trip();
      samples.push_back(ms_since(t0) / 2.0);
    }
    comm.barrier();
    out.bytes.push_back(bytes);
    out.ms.push_back(timing_stats(samples).median);
  }
  return out;
}

namespace {
// spindle-run sums a bucket's gradients after the backward pass has gone
// through the rest of the device's data: the bucket (and MPI's own
// buffers) are out of the caches by then. This writes one float per
// 64-byte line of a buffer of twice the last-level cache, from 64 to 256
// MiB, so that a timed all-reduce starts as cold. On a 32 MiB-L3 VM a 160
// KB all-reduce over 2 ranks takes 0.012 ms warm, 0.055 ms cold, and 0.075-
// 0.094 ms inside spindle-run (bench/history.md, "loop").
// The cap: sysconf reports the whole package's L3, and a virtual machine
// what its host's CPUID says (508 MiB on a 2-core VM of 2026-12-06, where
// 1 GiB sweeps made a 2-rank --measure of tiny-clip take 8.0-8.2 s; 2.7-2.9
// s capped, its all-reduce figures within their run-to-run spread). A core
// of AMD's server parts reaches at most 96 MiB of L3 (a 3D V-Cache die);
// Intel's share up to 320-504 MiB in a package (Emerald Rapids, Xeon 6),
// where 256 MiB may leave part of a bucket cached: only CPU-backend
// all-reduces there read a little fast.
constexpr size_t kMinEvictBytes = size_t{64} << 20;
constexpr size_t kMaxEvictBytes = size_t{256} << 20;
void evict_caches() {
  static std::vector<float> junk = [] {
    const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    const size_t bytes = std::clamp(llc > 0 ? 2 * static_cast<size_t>(llc) : 0, kMinEvictBytes, kMaxEvictBytes);
    return std::vector<float>(bytes / sizeof(float), 0.0f);
  }();
  for (size_t k = 0; k < junk.size(); k += 16) junk[k] += 1.0f;
}
}  // namespace

LinkSamples time_allreduce(Comm& comm, const std::vector<double>& sizes, const MeasureOptions& o) {
  LinkSamples out;
  for (double bytes : sizes) {
    std::vector<float> buf(static_cast<size_t>(bytes / 4.0), 1.0f);
    // Started and waited for, as spindle-run sums a gradient bucket
    // (Executor::start_bucket, finish_bucket; with --no-overlap too): a
    // non-blocking all-reduce may take another algorithm than the blocking
    // one (MPI's libnbc schedules, not its tuned collectives).
    auto once = [&]() { comm.wait_all_reduce(comm.start_all_reduce_sum(buf)); };
    comm.barrier();
    Clock::time_point t0 = Clock::now();
    for (int i = 0; i < 3; ++i) {
      evict_caches();
      once();
    }
    // Repeats by the time a timed run costs with its eviction.
    const int reps = agree_repeats(comm, ms_since(t0) / 3.0, o);
    std::vector<double> samples;
    for (int i = 0; i < reps; ++i) {
      evict_caches();
      comm.barrier();
      t0 = Clock::now();
      once();
      samples.push_back(ms_since(t0));
    }
    out.bytes.push_back(bytes);
    out.ms.push_back(timing_stats(samples).median);
  }
  return out;
}

namespace {
// Median ms of `once` (a local operation, nothing collective): 3 untimed
// runs, then as many timed as fit options.link_budget_ms, within
// [min_repeats, max_repeats].
double median_local_ms(const std::function<void()>& once, const MeasureOptions& o) {
  Clock::time_point t0 = Clock::now();
  for (int i = 0; i < 3; ++i) once();
  const double one_ms = ms_since(t0) / 3.0;
  const int reps = std::clamp(one_ms > 0 ? static_cast<int>(o.link_budget_ms / one_ms) : o.max_repeats,
                              o.min_repeats, o.max_repeats);
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) {
    t0 = Clock::now();
    once();
    samples.push_back(ms_since(t0));
  }
  return timing_stats(samples).median;
}
}  // namespace

LinkSamples time_copy(Backend& backend, const std::vector<double>& sizes, const MeasureOptions& o) {
  LinkSamples out;
  for (double bytes : sizes) {
    const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(bytes / 4.0));
    const Tensor src = to_backend(backend, Tensor::zeros({n}));
    auto once = [&]() {
      Tensor dst = backend.allocate({n});
      backend.copy(src, dst);
      backend.synchronize();
    };
    out.bytes.push_back(bytes);
    out.ms.push_back(median_local_ms(once, o));
  }
  return out;
}

double time_optimizer(Comm& comm, Backend& backend, int64_t values, const MeasureOptions& o) {
  const int64_t n = std::max<int64_t>(1, values);
  Tensor param = to_backend(backend, Tensor::zeros({n})), grad = to_backend(backend, Tensor::zeros({n}));
  Tensor m = to_backend(backend, Tensor::zeros({n})), v = to_backend(backend, Tensor::zeros({n}));
  const AdamWConfig cfg;
  int64_t step = 0;
  auto once = [&]() {
    const AdamWUpdate update{++step, &param, &grad, &m, &v};
    backend.adamw_steps(cfg, std::span(&update, 1));
    backend.synchronize();
  };
  comm.barrier();
  const double ms = std::max(median_local_ms(once, o), 1e-6);
  // bytes / ms / 1e6 = GB/s
  float rate = static_cast<float>(static_cast<double>(n) * plan::kAdamWBytesPerValue / (ms * 1e6));
  comm.all_reduce_sum({&rate, 1});
  return static_cast<double>(rate) / comm.size();
}

int64_t optimizer_measure_values(const plan::OpGraph& graph, int ranks) {
  std::map<std::string, int64_t> params;
  for (const plan::Operator& op : graph.ops)
    params.emplace(op.param, plan::op_param_count(op.workload.op, op.workload.dims, op.workload.seq));
  int64_t total = 0;
  for (const auto& [name, values] : params) total += values;
  return std::clamp<int64_t>(total / std::max(ranks, 1), int64_t{1} << 12, int64_t{1} << 24);
}

LinkSamples time_exchange(Comm& comm, double bytes, const std::vector<int>& messages, const MeasureOptions& o) {
  LinkSamples out;
  const int me = comm.rank();
  const size_t floats = static_cast<size_t>(std::max(1.0, bytes / 4.0));
  for (int k : messages) {
    std::vector<std::vector<float>> send(static_cast<size_t>(k), std::vector<float>(floats, 1.0f));
    std::vector<std::vector<float>> recv(static_cast<size_t>(k), std::vector<float>(floats, 0.0f));
    std::vector<Comm::SendBuf> sends;
    std::vector<Comm::RecvBuf> recvs;
    if (me <= 1) {
      const int peer = 1 - me;
      for (int i = 0; i < k; ++i) {
        sends.push_back({send[static_cast<size_t>(i)], peer});
        recvs.push_back({recv[static_cast<size_t>(i)], peer});
      }
    }
    auto once = [&]() {
      if (me <= 1) comm.exchange(sends, recvs, 0);
    };
    comm.barrier();
    Clock::time_point t0 = Clock::now();
    for (int i = 0; i < 3; ++i) once();
    const int reps = agree_repeats(comm, ms_since(t0) / 3.0, o);
    std::vector<double> samples;
    for (int i = 0; i < reps; ++i) {
      t0 = Clock::now();
      once();
      samples.push_back(ms_since(t0));
    }
    comm.barrier();
    out.bytes.push_back(k);
    out.ms.push_back(timing_stats(samples).median);
  }
  return out;
}

namespace {

// What the steps of measure_profile share.
struct Measuring {
  Comm& world;
  Backend& backend;
  const MeasureOptions& o;
  const ProgressFn& progress;
  Clock::time_point start;

  void report(const std::string& what, int done = 0, int total = 0, double left_s = 0) const {
    if (progress) progress({what, done, total, ms_since(start) / 1e3, left_s});
  }
};

// Send/recv between rank 0 and rank `b` over `sizes`, fitted into `into`.
// A fit that is not physical (time not growing with size) means the ranks
// were descheduled while timing (an oversubscribed or busy node): measured
// again, up to kLinkAttempts times in all. Rank 0's fit is the one that
// counts (shared later), so its verdict decides for every rank (time_p2p is
// collective). Appends to `failed` when no attempt fits.
void measure_p2p(const Measuring& m, int b, const std::vector<double>& sizes, plan::Link& into, const char* level,
                 std::vector<std::string>& failed) {
  m.report(std::string("send/recv ") + level);
  std::string error;
  for (int attempt = 1; attempt <= kLinkAttempts; ++attempt) {
    const LinkSamples s = time_p2p(m.world, 0, b, sizes, m.o);
    auto fit = fit_p2p_link(s.bytes, s.ms);
    std::vector<float> ok{m.world.rank() == 0 && fit.ok() ? 1.0f : 0.0f};
    m.world.all_reduce_sum(ok);
    if (fit.ok()) into = *fit;
    if (ok[0] > 0) return;
    error = fit.ok() ? "rank 0's fit failed" : fit.error().message;
  }
  failed.push_back(std::string(level) + " p2p: " + error + " (" + std::to_string(kLinkAttempts) + " attempts)");
}

// Copies, and (with two ranks in an island) exchanges of 1, 2, 4, 8
// messages: the software overhead's packing rate and per-exchange and
// per-message costs, into `overhead`. False (and `failed` says why) when
// not measured. `copy_us` is the per-copy intercept, for the note.
// `exchanged`: whether the exchange figures were timed too (islands of one
// device have no two ranks to exchange within one: the packing rate alone
// is measured, the exchange and message figures stay `overhead`'s).
bool measure_exchange_overhead(const Measuring& m, const std::vector<double>& sizes, const plan::Link& intra_p2p,
                               int dpi, plan::CommOverhead& overhead, double& copy_us, bool& exchanged,
                               std::vector<std::string>& failed) {
  exchanged = false;
  m.report("copies");
  const LinkSamples copies = time_copy(m.backend, sizes, m.o);
  auto copy = fit_copy(copies.bytes, copies.ms);
  if (!copy.ok()) failed.push_back("copies: " + copy.error().message);
  if (dpi < 2) {   // the same decision on every rank: time_exchange is collective
    if (!copy.ok()) return false;
    failed.push_back("exchange: one device per island, no two ranks to exchange within one: the per-exchange and "
                     "per-message figures stay the analytic ones");
    overhead.pack_gbytes_per_s = copy->pack_gbytes_per_s;
    copy_us = copy->copy_us;
    return true;
  }
  m.report("exchange");
  const std::vector<int> counts = {1, 2, 4, 8};
  const LinkSamples ex = time_exchange(m.world, sizes.front(), counts, m.o);
  // One message beyond the software: its send/recv time plus packing and unpacking its bytes.
  plan::CommOverhead copies_only;
  if (copy.ok()) copies_only.pack_gbytes_per_s = copy->pack_gbytes_per_s;
  const double wire_ms = plan::link_ms(intra_p2p, sizes.front()) + 2.0 * plan::pack_ms(copies_only, sizes.front());
  auto efit = fit_exchange(ex.bytes, ex.ms, wire_ms);
  if (!copy.ok() || !(intra_p2p.gbytes_per_s > 0)) {
    failed.push_back("exchange: no copy or intra-island send/recv figure to subtract");
    return false;
  }
  if (!efit.ok()) {
    failed.push_back("exchange: " + efit.error().message);
    return false;
  }
  overhead.pack_gbytes_per_s = copy->pack_gbytes_per_s;
  overhead.exchange_us = efit->exchange_us;
  overhead.message_us = efit->message_us + copy->copy_us;
  copy_us = copy->copy_us;
  exchanged = true;
  return true;
}

// Rank 0's link figures on every rank (the ones that count).
void share_rank0_links(Comm& world, plan::ProfileLinks& measured) {
  std::vector<float> share{static_cast<float>(measured.intra_p2p.gbytes_per_s), static_cast<float>(measured.intra_p2p.latency_us),
                           static_cast<float>(measured.inter_p2p.gbytes_per_s), static_cast<float>(measured.inter_p2p.latency_us),
                           static_cast<float>(measured.intra_allreduce.gbytes_per_s), static_cast<float>(measured.intra_allreduce.latency_us),
                           static_cast<float>(measured.inter_allreduce.gbytes_per_s), static_cast<float>(measured.inter_allreduce.latency_us)};
  if (world.rank() != 0) std::fill(share.begin(), share.end(), 0.0f);
  world.all_reduce_sum(share);
  measured.intra_p2p = {share[0], share[1]};
  measured.inter_p2p = {share[2], share[3]};
  measured.intra_allreduce = {share[4], share[5]};
  measured.inter_allreduce = {share[6], share[7]};
}

// Step 1 (under mpirun): links and the software overhead, into
// report.profile.links, report.overhead and report.notes. Returns `cluster`
// with the all-reduce fits as its island links (operators' own collectives
// use them where measured).
plan::Cluster measure_links(const Measuring& m, const std::vector<MeasureTarget>& targets, const plan::Model& model,
                            const plan::Profile& skeleton, const plan::Cluster& cluster, MeasureReport& report) {
  plan::Cluster links = cluster;
  const int ranks = m.world.size();
  if (ranks < 2) {
    report.notes.push_back("links: one rank, none measured (run under mpirun -np 2 or more); the cluster's "
                           "figures stay in use");
    return links;
  }
  const std::vector<double> sizes = link_message_sizes(targets, skeleton.entries, model.dtype, m.o.link_sizes);
  plan::ProfileLinks measured;
  measured.ranks = ranks;
  // With a host backend spindle-run all-reduces its gradient buckets over
  // MPI, which moves a started one only inside MPI calls and polls; over
  // NCCL (a device backend) they run on their own stream.
  measured.progress_in_calls = m.backend.device() == Device::host;
  const int dpi = std::max(cluster.devices_per_island, 1);
  std::vector<std::string> failed;
  if (dpi >= 2) measure_p2p(m, 1, sizes, measured.intra_p2p, "intra_island", failed);
  if (ranks > dpi) measure_p2p(m, dpi, sizes, measured.inter_p2p, "inter_island", failed);
  // Software overhead (rules/links.h CommOverhead): copies, exchanges, the all-reduce's fixed cost.
  plan::CommOverhead overhead = skeleton.overhead.value_or(plan::CommOverhead{});
  double copy_us = 0;
  bool exchanged = false;
  bool overhead_measured =
      measure_exchange_overhead(m, sizes, measured.intra_p2p, dpi, overhead, copy_us, exchanged, failed);
  const plan::Link& ring_link = ranks > dpi ? measured.inter_p2p : measured.intra_p2p;
  m.report("all-reduce");
  const LinkSamples s = time_allreduce(m.world, sizes, m.o);
  auto fit = fit_allreduce(s.bytes, s.ms, ranks, ring_link.latency_us);
  plan::Link& into = ranks > dpi ? measured.inter_allreduce : measured.intra_allreduce;
  if (fit.ok()) {
    into = fit->link;
    overhead.allreduce_us = fit->allreduce_us;
  } else {
    failed.push_back("all-reduce: " + fit.error().message);
    overhead_measured = false;
  }
  char line[256];
  std::string overhead_note;
  if (overhead_measured) {
    report.overhead = overhead;
    if (exchanged)
      std::snprintf(line, sizeof line,
                    "overhead: timed alone: exchange %.2f us + %.2f us per message (copy %.2f us), packing %.3f GB/s, "
                    "all-reduce %.2f us per call",
                    overhead.exchange_us, overhead.message_us, copy_us, overhead.pack_gbytes_per_s,
                    overhead.allreduce_us);
    else
      std::snprintf(line, sizeof line,
                    "overhead: timed alone: packing %.3f GB/s (copy %.2f us), all-reduce %.2f us per call; exchange "
                    "%.2f us + %.2f us per message analytic",
                    overhead.pack_gbytes_per_s, copy_us, overhead.allreduce_us, overhead.exchange_us,
                    overhead.message_us);
    overhead_note = line;
  }
  share_rank0_links(m.world, measured);
  report.profile.links = measured;
  if (measured.intra_allreduce.gbytes_per_s > 0) links.intra_island = measured.intra_allreduce;
  if (measured.inter_allreduce.gbytes_per_s > 0) links.inter_island = measured.inter_allreduce;
  std::snprintf(line, sizeof line, "links: %zu message sizes %.0f..%.0f bytes over %d ranks", sizes.size(),
                sizes.front(), sizes.back(), ranks);
  report.notes.push_back(line);
  for (const std::string& f : failed) report.notes.push_back("links: not measured: " + f);
  if (!overhead_note.empty()) report.notes.push_back(overhead_note);
  return links;
}

// How many ranks time a point of n devices at once: min(n, ranks) with
// options.together, else 1 (MeasureOptions::together).
int timing_group(const MeasureOptions& o, int n, int ranks) { return o.together ? std::min(n, ranks) : 1; }

// Per measured point (target, count), as timed by one rank.
constexpr size_t kFields = 6;   // median, p10, p90, repeats, comm ms, forward median

// Step 2: every (target, count) point timed, in passes: each pass times
// every point of this rank with 1/passes of the budget; the samples of all
// passes are pooled, so a burst of other work on the machine spoils some
// samples of many points, not all samples of one. A point is timed by one
// rank (the points shared round-robin), or with o.together and n >= 2 by
// ranks 0 .. min(n, ranks) - 1 at once, after a barrier (each its own copy;
// the figures are the mean over those ranks). Returns kFields figures per
// point, the same on every rank.
std::vector<float> time_points(const Measuring& m, const std::vector<MeasureTarget>& targets,
                               const plan::Cluster& links) {
  struct Point { size_t target; int n; double analytic_ms; };
  std::vector<Point> points;
  for (size_t i = 0; i < targets.size(); ++i)
    for (size_t k = 0; k < targets[i].counts.size(); ++k)
      points.push_back({i, targets[i].counts[k], k < targets[i].analytic_ms.size() ? targets[i].analytic_ms[k] : 0.0});
  const size_t np = points.size();
  const int ranks = m.world.size(), me = m.world.rank();
  const auto group = [&](size_t p) { return timing_group(m.o, points[p].n, ranks); };
  std::vector<float> result(np * kFields, 0.0f);
  std::vector<size_t> own, joint;   // the points this rank times alone; those timed by a group of ranks
  size_t alone = 0;
  for (size_t p = 0; p < np; ++p) {
    if (group(p) >= 2) joint.push_back(p);
    else if (static_cast<int>(alone++ % static_cast<size_t>(ranks)) == me) own.push_back(p);
  }
  int in_joint = 0;   // joint points this rank takes part in
  for (size_t p : joint) in_joint += me < group(p) ? 1 : 0;
  const int passes = std::max(m.o.passes, 1);
  MeasureOptions per_pass = m.o;
  per_pass.point_budget_ms = m.o.point_budget_ms / passes;
  per_pass.min_repeats = (m.o.min_repeats + passes - 1) / passes;
  per_pass.max_repeats = std::max(1, m.o.max_repeats / passes);
  std::vector<std::vector<double>> samples(np), forward(np);
  const int mine = (static_cast<int>(own.size()) + in_joint) * passes;
  int done = 0;
  // The time left (MeasureProgress::left_s): each pass of a point weighs
  // its expected time at the analytic profile's pace (every point the same
  // when the skeleton has no times), scaled by the pace measured so far.
  std::vector<double> weight(np, 0.0);
  for (size_t p = 0; p < np; ++p) weight[p] = expected_point_ms(points[p].analytic_ms, per_pass);
  const auto this_ranks_weight = [&] {   // over every pass of the points this rank times
    double w = 0;
    for (size_t p : own) w += weight[p];
    for (size_t p : joint) w += me < group(p) ? weight[p] : 0.0;
    return passes * w;
  };
  double weight_left = this_ranks_weight(), weight_done = 0;
  if (!(weight_left > 0)) {
    std::fill(weight.begin(), weight.end(), 1.0);
    weight_left = this_ranks_weight();
  }
  const Clock::time_point ops_start = Clock::now();
  const auto time_point = [&](size_t p, int pass) {
    const MeasureTarget& t = targets[points[p].target];
    const double spent = ms_since(ops_start) / 1e3;
    m.report(short_name(t.workload) + " on " + std::to_string(points[p].n), done, mine,
             weight_done > 0 ? spent * weight_left / weight_done : weight_left / 1e3);
    const OpTiming tm = time_operator(t, points[p].n, m.backend, per_pass);
    samples[p].insert(samples[p].end(), tm.samples_ms.begin(), tm.samples_ms.end());
    forward[p].insert(forward[p].end(), tm.forward_samples_ms.begin(), tm.forward_samples_ms.end());
    if (pass == 0 && (group(p) < 2 || me == 0))   // a joint point's: rank 0's alone
      result[p * kFields + 4] = static_cast<float>(op_comm_ms(t, points[p].n, tm.tp, links));
    ++done;
    weight_done += weight[p];
    weight_left = std::max(weight_left - weight[p], 0.0);
  };
  for (int pass = 0; pass < passes; ++pass) {
    for (size_t p : own) time_point(p, pass);
    for (size_t p : joint) {
      m.world.barrier();   // the ranks of the group start together
      if (me < group(p)) time_point(p, pass);
    }
  }
  // The figures of each point this rank timed, times 1 / its group's size:
  // summed over the group below, a joint point's are the mean of its ranks'.
  const auto write = [&](size_t p) {
    const float share = 1.0f / static_cast<float>(group(p));
    const TimingStats st = timing_stats(samples[p]);
    result[p * kFields + 0] = static_cast<float>(st.median) * share;
    result[p * kFields + 1] = static_cast<float>(st.p10) * share;
    result[p * kFields + 2] = static_cast<float>(st.p90) * share;
    result[p * kFields + 3] = static_cast<float>(samples[p].size());
    result[p * kFields + 5] = static_cast<float>(timing_stats(forward[p]).median) * share;
  };
  for (size_t p : own) write(p);
  for (size_t p : joint)
    if (me < group(p)) write(p);
  m.report("done", done, mine);
  // Each point alone is nonzero on exactly one rank; a joint point's
  // figures add up over its group (its comm figure: rank 0's alone).
  m.world.all_reduce_sum(result);
  return result;
}

// Step 3: the skeleton's entries with the measured times of `result`
// (time_points, points in entry order, count order), into report.profile.
// Returns the number of timed runs.
int fill_profile(const plan::Profile& skeleton, const std::vector<float>& result, MeasureReport& report) {
  plan::Profile& prof = report.profile;
  prof.device = skeleton.device;
  prof.cluster = skeleton.cluster;
  prof.source = "measured";
  prof.overhead = report.overhead ? report.overhead : skeleton.overhead;
  prof.entries = skeleton.entries;
  size_t p = 0;
  int total_repeats = 0;
  for (plan::ProfileEntry& e : prof.entries) {
    e.source.clear();
    // The forward's share of the compute, over every point of the entry
    // (the simulation splits each slice's ms by it; x-forward_share).
    double forward_ms = 0, compute_ms = 0;
    for (plan::ProfilePoint& pt : e.points) {
      const float* r = &result[p * kFields];
      const TimingStats st{r[0], r[1], r[2]};
      pt.ms = std::max(static_cast<double>(r[0]) + r[4], 1e-6);
      pt.spread = st.spread();
      total_repeats += static_cast<int>(r[3]);
      forward_ms += r[5];
      compute_ms += r[0];
      ++p;
    }
    e.forward_share = compute_ms > 0 ? std::clamp(forward_ms / compute_ms, 0.0, 1.0) : -1.0;
  }
  return total_repeats;
}

}  // namespace

plan::Result<MeasureReport> measure_profile(const plan::Model& model, const plan::OpGraph& graph,
                                            const plan::Profile& skeleton, const plan::Cluster& cluster,
                                            Comm& world, Backend& backend, const MeasureOptions& o,
                                            const ProgressFn& progress) {
  SPINDLE_ASSIGN(targets, measure_targets(model, graph, skeleton));
  const Measuring m{world, backend, o, progress, Clock::now()};
  MeasureReport report;
  const plan::Cluster links = measure_links(m, targets, model, skeleton, cluster, report);
  const std::vector<float> result = time_points(m, targets, links);
  const int total_repeats = fill_profile(skeleton, result, report);
  const int64_t step_values = optimizer_measure_values(graph, world.size());
  report.profile.optimizer_gbytes_per_s = time_optimizer(world, backend, step_values, o);
  report.points = static_cast<int>(result.size() / kFields);
  int together = 0;   // points timed on several ranks at once (time_points)
  for (const MeasureTarget& t : targets)
    for (int n : t.counts) together += timing_group(o, n, world.size()) >= 2 ? 1 : 0;
  char line[320];
  std::snprintf(line, sizeof line,
                "operators: %d points on %d rank(s) (%d of them on min(n, ranks) ranks at once), %d timed runs, "
                "backend %s, %.1f s in all",
                report.points, world.size(), together, total_repeats, backend.name(), ms_since(m.start) / 1e3);
  report.notes.push_back(line);
  std::snprintf(line, sizeof line, "optimizer: AdamW over %lld values per rank, %.3g GB/s (%d bytes per value)",
                static_cast<long long>(step_values), *report.profile.optimizer_gbytes_per_s,
                plan::kAdamWBytesPerValue);
  report.notes.push_back(line);
  return report;
}

}  // namespace spindle::exec
