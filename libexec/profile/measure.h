// `spindle-profile --measure` (docs/profiling.md): times every operator
// workload of a model with the runtime's own operators on a Backend, and,
// under mpirun, the collectives the planner's cost model uses.
//
// What one profile point is: the median time of ONE operator, forward plus
// backward, at the local batch the runtime runs on n devices (batch * K / n
// for a module with tensor_parallel K), on one rank, plus the communication
// inside the operator that the runtime performs, modelled from link figures
// (measured ones when present): a TP shard's all-reduces and all-gathers (the
// shard is timed on one rank with its collectives recorded, not performed),
// and contrastive_loss's all-gather of both embeddings over its n devices.
// Data readers include drawing their synthetic batch, as spindle-run does.
//
// Errors: a model/profile mismatch is an Error value; communication errors
// abort the job (comm.h); an operator that throws propagates its exception.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "libexec/backend/backend.h"
#include "libexec/comm/comm.h"
#include "libexec/profile/fit.h"
#include "libplan/graph/op_graph.h"
#include "libplan/io/profile.h"
#include "libplan/model/cluster.h"
#include "libplan/model/model.h"
#include "libplan/util/status.h"

namespace spindle::exec {

// Tunables of a measurement, each with its default (declared once, here).
struct MeasureOptions {
  int warmup = 3;                 // untimed forward+backward runs before each point
  int min_repeats = 6;            // timed runs per point, at least ...
  int max_repeats = 300;          // ... and at most
  double point_budget_ms = 120;   // stop repeating a point once its timed runs took this long
  int passes = 3;                 // the points are timed in this many passes (budget and
                                  // repeats split among them), samples pooled: robust to
                                  // bursts of other work on the machine
  int link_sizes = 8;             // message sizes per collective (log-spaced)
  double link_budget_ms = 40;     // per message size and collective
  uint64_t seed = 0;              // parameters and inputs
  // Data readers (patch_embed, token_embed, lm_loss's targets) include the
  // synthetic data spindle-run draws inside their forward (exec/data.h).
  bool include_data = true;
  // Host threads that seed a point's parameters and draw its inputs and
  // synthetic data (the values do not depend on it): 1 on the CPU backend; spindle-profile gives a
  // CUDA rank the host's cores over its ranks (host_threads_for, backend.h),
  // since drawing a ViT-H point's inputs on one core took longer than
  // timing it on an H200.
  int host_threads = 1;
  // A point of n >= 2 devices timed on min(n, ranks) ranks at once, each
  // with its own copy, as a slice of n devices runs (the figure: the mean of
  // their medians); points of 1 device are shared among the ranks. For
  // ranks that share one memory system (the CPU backend): an operator
  // beside a copy of itself on the other cores runs slower than beside
  // other work (tiny-clip on 2 CPU ranks: 15-25% on a data-parallel step).
  // Off, every point is timed by one rank.
  bool together = false;
};

// One profile entry's operator, as the runtime builds it.
struct MeasureTarget {
  plan::Workload workload;
  int tensor_parallel = 1;
  int64_t max_seq = 0;            // rows of the position tables (largest S of its modules)
  std::vector<int> counts;        // device counts to time (the entry's points)
  // The skeleton's time of each count (ms, forward plus backward), parallel
  // to counts: for the estimate of how long timing takes, nothing else.
  std::vector<double> analytic_ms;
};

// The targets of a profile skeleton (analytic_profile of the same model:
// its entries' keys and counts), in entry order. Error when an entry names a
// workload the model does not use.
plan::Result<std::vector<MeasureTarget>> measure_targets(const plan::Model& model, const plan::OpGraph& graph,
                                                         const plan::Profile& skeleton);

// Collectives a TP shard issued in one forward + backward (recorded, not
// performed), element counts per call.
struct TpCalls {
  std::vector<int64_t> allreduce_floats;
  std::vector<int64_t> allgather_floats;   // this rank's send count
};

struct OpTiming {
  TimingStats compute_ms;   // forward + backward, this rank's compute only
  int repeats = 0;
  std::vector<double> samples_ms;   // every timed run, in order
  std::vector<double> forward_samples_ms;   // the forward of each (with the data it draws)
  TpCalls tp;
};

// Times one forward + backward of `t`'s operator on n devices (local batch
// batch * K / n; contrastive_loss always the full batch, as the runtime
// computes it) on `backend`. n must be one of t.counts' kind of count (a
// multiple of K dividing batch * K).
OpTiming time_operator(const MeasureTarget& t, int n, Backend& backend, const MeasureOptions& options);

// Communication inside one operator on n devices, ms, over `links`' figures
// (a cluster whose links are the measured ones where known): the recorded TP
// collectives as ring collectives over K devices, and for contrastive_loss
// the all-gather of both [batch / n, dim] embeddings over n devices.
double op_comm_ms(const MeasureTarget& t, int n, const TpCalls& tp, const plan::Cluster& links);

// Message sizes, bytes, the planner will cost for this model: gradient
// all-reduces (an operator's parameter bytes / K) and inter-wave transfers
// (an output's bytes per sample x batch / n), as `count` log-spaced sizes
// between the smallest and largest (multiples of 4 bytes, at least 4). The
// largest is at least kMinLargestLinkMessage: below that, a fast link moves
// the bytes in about its latency, and timing noise can hide the bandwidth
// term (the fit needs times that grow with size).
constexpr double kMinLargestLinkMessage = 4 << 20;
std::vector<double> link_message_sizes(const std::vector<MeasureTarget>& targets,
                                       const std::vector<plan::ProfileEntry>& entries, plan::DType dtype,
                                       int count);

// Timings of one collective at each size: one-way ms per message.
struct LinkSamples {
  std::vector<double> bytes, ms;
};
// Ping-pong between ranks a != b of `comm` (one-way time = round trip / 2,
// median). Collective over comm (other ranks wait); valid on rank a.
LinkSamples time_p2p(Comm& comm, int a, int b, const std::vector<double>& sizes, const MeasureOptions& options);
// all_reduce_sum over all of `comm`, started and waited for (median of rank
// 0's times, a barrier before each, and the caches evicted before each: the
// runtime sums a bucket after the backward pass has gone through the rest
// of the device's data). Collective over comm; valid on rank 0.
LinkSamples time_allreduce(Comm& comm, const std::vector<double>& sizes, const MeasureOptions& options);

// One copy of `bytes` on `backend` as the runtime packs a message
// (allocate a tensor, copy rows into it, synchronize), median ms per size.
// Local: every rank may call it alone.
LinkSamples time_copy(Backend& backend, const std::vector<double>& sizes, const MeasureOptions& options);
// The optimizer's rate: one AdamW step (Backend::adamw_steps, as the
// executor steps a bucket's tensors) over `values` fp32 values in one tensor, every rank of
// `comm` its own at once after a barrier (as every rank steps its shards at
// the end of a training step), median of the repeats. Returns GB/s of
// rules/memory.h's kAdamWBytesPerValue per value, the mean over the ranks.
// Collective over comm.
double time_optimizer(Comm& comm, Backend& backend, int64_t values, const MeasureOptions& options);
// The values time_optimizer steps for `graph`: its distinct parameters'
// values over `ranks` (about what each rank steps), in [2^12, 2^24].
int64_t optimizer_measure_values(const plan::OpGraph& graph, int ranks);

// Comm::exchange between ranks 0 and 1 of `comm`, each sending k messages of
// `bytes` to the other and receiving k, for each k of `messages`: median ms
// of one exchange (back to back; the exchange itself pairs the ranks).
// LinkSamples::bytes holds k. Collective over comm (other ranks wait);
// valid on rank 0.
LinkSamples time_exchange(Comm& comm, double bytes, const std::vector<int>& messages, const MeasureOptions& options);

// The wall time one time_operator call is expected to take (ms), for an
// operator whose forward plus backward runs in run_ms: o.warmup untimed runs,
// then timed runs until there are at least o.min_repeats and either
// o.point_budget_ms is spent or o.max_repeats are done. Drawing the inputs
// and parameters is not counted. For estimates only: run_ms comes from the
// analytic profile, and the progress line scales it by the pace measured.
double expected_point_ms(double run_ms, const MeasureOptions& o);

// Progress of a measurement, for the terminal line.
struct MeasureProgress {
  std::string what;       // the workload (or collective) being timed
  int done = 0;           // points this rank has finished
  int total = 0;          // points this rank times
  double elapsed_s = 0;   // since the measurement started
  // Seconds this rank's operators have left, an estimate: each point
  // weighted by expected_point_ms of its analytic time, scaled by the pace
  // of the points timed so far (before the first: the analytic times as
  // they are). 0 outside the operators.
  double left_s = 0;
};
using ProgressFn = std::function<void(const MeasureProgress&)>;

struct MeasureReport {
  plan::Profile profile;          // valid on rank 0 of world
  std::optional<plan::CommOverhead> overhead;   // measured (under mpirun, rank 0); else absent
  std::vector<std::string> notes; // what was measured and assumed, one line each
  int points = 0;
};

// The whole measurement. `skeleton` is analytic_profile(model, graph, cluster,
// counts) (keys, sizes, counts); the result keeps its entries and sizes with
// measured times, source "measured", and, when world has more than one rank,
// measured link figures in profile.links and the runtime's software overhead
// in profile.overhead (else the skeleton's analytic figures):
//  - copies: time_copy over the link sizes, fit_copy;
//  - exchanges: time_exchange of 1, 2, 4, 8 messages of the smallest link
//    size between ranks 0 and 1, fit_exchange (message_us adds the
//    per-copy intercept: one copy per message);
//  - all-reduce: fit_allreduce over the link sizes (alpha + beta * bytes);
//  - the optimizer step: time_optimizer, in profile.optimizer_gbytes_per_s
//    (with one rank too);
// and measured link figures in profile.links:
//  - all ranks within one island: intra-island p2p (ranks 0 and 1) and
//    all-reduce (whole world);
//  - ranks across islands: intra p2p (0 and 1, if an island holds two),
//    inter p2p (0 and devices_per_island) and the world all-reduce as the
//    inter-island all-reduce (the slowest link decides the ring).
// Points are shared round-robin among world's ranks, timed concurrently (as
// the runtime's ranks compute concurrently) and summed back to every rank;
// with options.together, a point of n >= 2 devices is timed on min(n, ranks)
// ranks at once instead (MeasureOptions::together).
// Collective over world.
plan::Result<MeasureReport> measure_profile(const plan::Model& model, const plan::OpGraph& graph,
                                            const plan::Profile& skeleton, const plan::Cluster& cluster,
                                            Comm& world, Backend& backend, const MeasureOptions& options,
                                            const ProgressFn& progress);

}  // namespace spindle::exec
