// The last step of `spindle-profile --measure` under mpirun with a host
// backend (docs/profiling.md, "The executor's own overhead"): train a few
// steps of a plan of the model with spindle-run's executor on the measuring
// ranks, and fit the executor's software cost around its transfers
// (rules/links.h CommOverhead::instruction_us, message_us,
// accumulate_gbytes_per_s) from the instructions that never wait for a peer.
//
// Why not time Comm calls alone: on 2 CPU ranks the executor spends about
// 0.5 us of bookkeeping on every exchange instruction, 2-3 us posting a
// message (a fresh buffer, the copy, the call, its request) and adds
// backward pieces into a fresh buffer at about 10 GB/s, where a loop of bare
// Comm::exchange calls on preallocated buffers takes 0.07 us per message.
#pragma once

#include <string>
#include <vector>

#include "libexec/backend/backend.h"
#include "libexec/comm/comm.h"
#include "libexec/exec/executor.h"
#include "libexec/profile/fit.h"
#include "libplan/cost/cost_model.h"
#include "libplan/graph/op_graph.h"
#include "libplan/io/profile.h"
#include "libplan/lower/lower.h"
#include "libplan/model/cluster.h"
#include "libplan/model/model.h"
#include "libplan/plan/plan.h"
#include "libplan/sim/sim.h"
#include "libplan/util/status.h"

namespace spindle::exec {

// The plan the calibration trains: Spindle's plan of `model` on `cluster`
// priced by `cost` (the profile just measured; `profile_sha256` recorded),
// its optimizer state replicated (its buckets all-reduce:
// fit_executor_allreduce), checked as spindle-run checks a plan. Error when
// the cluster does not have `ranks` devices (the plan must run on the
// measuring ranks) or the planner fails.
plan::Result<plan::Plan> calibration_plan(const plan::Model& model, const plan::OpGraph& graph,
                                          const plan::Cluster& cluster, const plan::CostModel& cost,
                                          const std::string& profile_sha256, int ranks);

// The same plan with ZeRO-1 (optimizer state sharded), its values gathered
// right after each bucket's optimizer step (ParamGather::after_step: a
// blocking allgather instruction, timed whole), for calibrate_zero1.
plan::Plan sharded_calibration_plan(const plan::Plan& replicated);

// The samples of device d's program in `l` from `steps`, each one step's
// StepStats::instr_ms: every post_send, post_recv and exchange that receives
// no message from another device (the others may wait for a peer), its
// median over the steps in us less pack_ms(`packing`, the bytes it sends);
// messages: the messages it sends; accumulated_bytes: in a backward
// exchange, the bytes of every piece it adds (plan::Transfer::adds). Pure.
std::vector<OverheadSample> overhead_samples(const plan::Lowered& l, int d,
                                             const std::vector<std::vector<double>>& steps,
                                             const plan::CommOverhead& packing);

// The all-reduce as the executor runs it, from its gradient buckets: per
// bucket and step, the least over its members of the time in its allreduce
// (or allreduce_start plus allreduce_wait) instructions (the last member to
// arrive waits for no one), median over the steps. `cost` prices a bucket
// as the ring formula (latency terms and wire) plus the copies plus the
// fixed cost (CostModel::allreduce_ms): `allreduce_us` is the median over
// the buckets of the measured time less all of that but the fixed cost, at
// least 0. When that median is below 0 (the buckets run faster than the
// formula with no fixed cost at all: the link's all-reduce was timed with
// cold caches, the executor's buckets are warm), `intra_rate_scale` is by
// how much the link's all-reduce rate inside an island must be multiplied
// for the wire to take what the buckets inside one island
// (devices_per_island) show with a fixed cost of 0: the median over them
// of their priced wire time over their measured time, both less the ring's
// latency terms and the copies; else, or when no bucket shows a wire time,
// 0 (keep the link's). `ms`: by rank, step, then bucket, the rank's ms in
// that bucket's instructions, negative where the rank is not a member.
// allreduce_us is -1 when no bucket has two members and a time. Pure.
struct AllreduceInSitu {
  double allreduce_us = -1;
  double intra_rate_scale = 0;
};
AllreduceInSitu fit_executor_allreduce(const plan::Lowered& l, const plan::CostModel& cost, int devices_per_island,
                                       const std::vector<std::vector<std::vector<double>>>& ms);

// ZeRO-1's collectives as the executor runs them, from the buckets of a
// sharded plan (Lowered::sharded_state): for collective `c`
// (reduce_scatter or allgather), the median over the buckets of the bucket's
// time (per step the least over its members, median over the steps; `ms`
// as fit_executor_allreduce's) less its price in `cost` without the fixed
// cost (CostModel::reduce_scatter_ms or allgather_ms of
// Lowered::gather_bytes, less collective_overhead_ms at 0 bytes), at least
// 0: CommOverhead::reduce_scatter_us or allgather_us. -1 when no bucket has
// two members and a time. Pure.
double fit_executor_fixed_us(const plan::Lowered& l, const plan::CostModel& cost, plan::Collective c,
                             const std::vector<std::vector<std::vector<double>>>& ms);

// The optimizer as the executor runs it: per step, the bytes of the values
// device d's optimizer instructions in `l` stepped (plan::kAdamWBytesPerValue
// each) over their time in that step (`steps`: each step's
// StepStats::instr_ms), in GB/s; -1 for a step where they stepped nothing or
// took no time. One sample per step, so every rank has as many. Pure.
std::vector<double> optimizer_rate_samples(const plan::Lowered& l, int d,
                                           const std::vector<std::vector<double>>& steps);

// The operators as the executor runs them, against the profile: over
// device d's forward and backward instructions in `l`, the sum of their
// median times over `steps` (each one step's StepStats::instr_ms) and the
// sum of their boxes' durations in `sim`, a simulation of `l`'s programs
// priced by the profile (boxes by device, then program order; a box whose
// instruction in `l` is no forward or backward is left out). Pure.
//
// Why: --measure times each operator alone, repeated on the same inputs
// (warm); in a step it follows other operators, and on a 2-core VM ran
// 12-25% slower (bench/history.md, loop, 2026-12-06) in every run.
struct ComputeInSitu {
  double measured_ms = 0;
  double profiled_ms = 0;
  int instructions = 0;
};
ComputeInSitu compute_in_situ(const plan::Lowered& l, int d, const std::vector<std::vector<double>>& steps,
                              const plan::Simulation& sim);

// Whether the profile takes a Calibration::compute_scale as its
// "x-compute": "" when it does; else why not. Not when none was measured
// (< 0); not outside [kMinAppliedComputeScale, kMaxAppliedComputeScale],
// where a step ran so far from the operators' times alone that the
// machine more likely changed between the two (another load) than the
// operators; not when more ranks than cores share the host (`ranks_here`
// > `cores`, cores > 0): a rank then computes slower by how many others
// compute beside it on its core, which the plan decides (4 ranks of
// tiny-clip on 2 cores: 1.65-2.11, and a run of the plan made with 1.65
// computed at 0.67-0.83 of its prediction). Pure.
inline constexpr double kMinAppliedComputeScale = 0.5;
inline constexpr double kMaxAppliedComputeScale = 2.0;
std::string compute_scale_refusal(double scale, int ranks_here, int cores);

struct Calibration {
  ExecutorOverheadFit fit;
  int steps = 0;     // timed steps (after 2 untimed)
  int samples = 0;   // instructions fitted, over all ranks
  AllreduceInSitu allreduce;   // fit_executor_allreduce (allreduce_us -1: the plan all-reduces nothing)
  // The optimizer's rate in the executor's steps: the median of every
  // rank's optimizer_rate_samples, in GB/s; -1 when none has one.
  double optimizer_gbytes_per_s = -1;
  // The operators' time in the executor's steps over the profile's, summed
  // over every rank's compute_in_situ; -1 when none has a forward or
  // backward instruction with a time.
  double compute_scale = -1;
  int compute_instructions = 0;   // over all ranks
};

// Trains `plan` (which must have passed check_plan_status against `model`,
// whose expansion `graph` is)
// with an Executor on `world` (`groups`: as spindle-run creates them): 2
// untimed steps, then as many as fit `budget_ms` by the slowest rank's
// first step, 5 to 30; pools every rank's overhead_samples and fits them
// (fit_executor_overhead: the same on every rank), fits the all-reduce
// against `cost` (fit_executor_allreduce, on the same times everywhere:
// the same on every rank given the same `cost`) and the optimizer's rate
// (Calibration::optimizer_gbytes_per_s, pooled the same way) and the
// operators' time against `cost`'s (compute_in_situ summed over the ranks).
// Collective over world; an executor error throws (as spindle-run's would).
plan::Result<Calibration> calibrate_executor(const plan::Model& model, const plan::OpGraph& graph,
                                             const plan::Plan& plan, Comm& world,
                                             GroupComms groups, Backend& backend,
                                             const plan::CommOverhead& packing, const plan::CostModel& cost,
                                             double budget_ms = 1500);

// ZeRO-1's fixed costs per call (CommOverhead::reduce_scatter_us and
// allgather_us; -1 where the plan has no bucket of two members, or is not
// sharded), fitted by fit_executor_fixed_us against `cost` (the profile
// with calibrate_executor's figures in) from `sharded` (a
// sharded_calibration_plan, checked) trained as calibrate_executor trains.
// Why not the all-reduce's: on 2 CPU ranks (tiny-clip, 199 kB buckets) the
// executor's reduce-scatter took 80-140 us and its all-gather 80-100 us,
// where the ring formula at the all-reduce's rate gives 37 us each: the
// gradients come to it cold from the backward pass, and its buffers are
// fresh. Collective over world; an executor error throws.
struct Zero1InSitu {
  double reduce_scatter_us = -1;
  double allgather_us = -1;
  int steps = 0;   // timed steps
};
Zero1InSitu calibrate_zero1(const plan::Model& model, const plan::Plan& sharded, Comm& world, GroupComms groups,
                            Backend& backend, const plan::CostModel& cost, double budget_ms = 1500);

}  // namespace spindle::exec
