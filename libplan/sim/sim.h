// Discrete-event simulation of the lowered programs (docs/simulation.md):
// every device runs its program (libplan/lower/lower.h) in order, as
// spindle-run does, with costs in place of kernels and messages. No wave
// barrier: an instruction starts as soon as the device has finished the one
// before it (its deps are earlier instructions of the same program, so they
// are done by then) and, for an exchange or a collective (all-reduce,
// all-gather), as soon as its peers allow.
//
// What is priced:
//   forward, backward  the slice's plan time (slice.ms = count x T(n), forward
//                      plus backward) split forward_share : 1 - forward_share
//                      (1/3 : 2/3 by default: a backward costs two forwards,
//                      the 3 x forward FLOPs of docs/workloads.md)
//   optimizer          CostModel::optimizer_ms of the values it steps (AdamW
//                      is memory-bound: rules/memory.h, at the profile's
//                      "x-optimizer" rate; 0 ms without one)
//   norm_sum           CostModel::norm_sum_ms of the gradient values it reads
//                      (4 bytes each at the same rate)
//   exchange           done on a device when every message it receives has
//                      arrived and every message it sends has been delivered.
//                      A message leaves once its sender has reached the
//                      exchange or, posted early, the post_send (eager: the
//                      receiver need not be there yet)
//                      and all the links it needs are idle; it takes
//                      CostModel::p2p_ms(bytes, cross_island). Links: the
//                      destination device's inbound link (a message inside
//                      an island); the source island's uplink and the
//                      destination island's downlink (a message across
//                      islands). A link carries one message at a time
//                      (serialised, full bandwidth each). Whenever a link
//                      frees or a message becomes ready, the waiting
//                      messages are started in order of readiness (ties:
//                      source device, then transfer index), each one whose
//                      links are all idle; one waiting for a busy link does
//                      not hold back a later one whose links are idle (no
//                      reservations). Local copies cost 0.
//   post_send          the sender's packing (exchange overhead with its
//                      messages and sent bytes); then it goes on, and its
//                      messages move beside its work (its exchange, if any,
//                      no longer waits for them). post_recv:
//                      CommOverhead::instruction_us (its messages are
//                      priced in their exchange).
//                      wait_sends: until every message of the device's
//                      post_sends has been delivered, then
//                      CommOverhead::instruction_us. A backward exchange,
//                      after its last message, also adds every piece it got
//                      (accumulate_ms).
//   all-reduce         takes CostModel::allreduce_ms(bytes, devices). A
//                      device runs one all-reduce at a time (they share its
//                      links): one starts when every device of the bucket
//                      has reached it (the blocking allreduce, or
//                      allreduce_start) and each has ended the all-reduces
//                      that began before; groups are served in the order
//                      they complete (each group's communicator progresses
//                      on its own: no head-of-line blocking). It does not
//                      contend with messages or compute.
//                      A device goes on past allreduce_start at once (the
//                      all-reduce runs beside its backward pass) and past
//                      allreduce_wait once the all-reduce has ended.
//   all-gather         (sharded optimizer state, ZeRO-1: Lowered::sharded_state)
//                      a collective over the bucket's devices, simulated
//                      as the all-reduce is (the whole group there, each
//                      member done with the collectives that began before:
//                      a device runs one collective at a time, all-reduces
//                      and all-gathers alike; polls), but a collective of
//                      its own, taking
//                      CostModel::allgather_ms(Lowered::gather_bytes(b),
//                      devices). Blocking (allgather): the device goes on
//                      at its end. Started (allgather_start, as a program
//                      opens, with overlap): the device goes on at once,
//                      the all-gather runs beside its forward pass, and
//                      allgather_wait blocks until it has ended.
//   grad_norm          (GradSync::grad_norm) a blocking all-reduce of one
//                      value (kNormBytes) over every device, simulated as a
//                      blocking bucket all-reduce: a collective of its own.
//
// Deterministic: events ordered by time, then kind, then device, then index.
#pragma once

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "libplan/cost/cost_model.h"
#include "libplan/graph/op_graph.h"
#include "libplan/lower/lower.h"
#include "libplan/model/model.h"
#include "libplan/plan/plan.h"
#include "libplan/util/status.h"

namespace spindle::plan {

struct SimOptions {
  double forward_share = 1.0 / 3.0;   // of a slice's ms spent in its forward, in [0, 1]
  // By lowered slice, its own forward share in [0, 1] (empty: forward_share
  // for every slice). simulate_plan fills it from the cost model when the
  // profile measured them (CostModel::forward_share, "x-forward_share").
  std::vector<double> slice_forward_share;
  bool price_compute = true;          // false: forward and backward take 0 ms
  bool price_communication = true;    // false: messages and all-reduces take 0 ms
  bool price_optimizer = true;        // false: optimizer steps take 0 ms (as without price_compute)
  // false: only Simulation::iteration_ms and devices[].finish_ms are filled
  // (no boxes, messages or parts): what the planner's objective needs, faster.
  // With price_communication false as well, they come from one pass over
  // the programs' dependencies instead of events (docs/simulation.md,
  // "Compute alone, in one pass"): the same figures to the bit.
  bool timeline = true;
  // The simulation gives up once its makespan must pass this many ms (its
  // clock passes it, or a device's compute left and collectives not yet
  // begun would end past it): the result is then iteration_ms = infinity
  // and nothing else (a bound for comparing candidates: one that cannot
  // beat the best so far stops early). Else the result is the unbounded one.
  double stop_after_ms = std::numeric_limits<double>::infinity();
  // simulate_plan lowers with this LowerOptions::sync; empty: the plan's
  // own (planned_sync: its overlap and bucket cap, as spindle-run given no
  // flag lowers it). Where there is no plan (simulate, the lower bounds),
  // empty means GradSync{}.
  std::optional<GradSync> sync;
  // A replay: by device, then by instruction of its program, the ms that a
  // forward, backward, optimizer or norm_sum instruction takes in place of its priced
  // time (bench/loop gives the durations spindle-run measured, so that the
  // waits and communication are simulated around the compute that really
  // ran). An entry < 0 keeps the priced time; every other kind of
  // instruction must have one < 0. Empty: no replay; else one list per
  // device, as long as its program (an error otherwise). Applies only with
  // price_compute, and not with a finite stop_after_ms (its bounds price
  // compute from the slices: an error).
  std::vector<std::vector<double>> replay_ms;
  // A replay's start: by device, the ms after the step's start at which its
  // program begins (bench/loop gives when each rank's first box of the step
  // began, after the earliest rank's: the host time a rank spends between
  // steps, e.g. rank 0 writing the metrics, delays its first instruction,
  // a started all-gather included). Empty: every device at 0; else one
  // finite figure >= 0 per device (an error otherwise). Replays only, as
  // replay_ms.
  std::vector<double> replay_start_ms;
  // Also find the critical path (Simulation::critical, critical_slices,
  // SimBox::critical): what each end waited for last is the instruction
  // before it on its device, a message's delivery, the collective's (an
  // all-reduce's or all-gather's) last member to arrive, the message
  // before on a busy link, a member's collective before, or a member's
  // compute before it polled.
  bool critical_path = false;
};

enum class SimTrack { compute = 0, communication = 1 };   // the Chrome trace's tid

// One box of the simulated timeline.
struct SimBox {
  int device = 0;
  SimTrack track = SimTrack::compute;
  std::string cat;      // forward | backward | optimizer | exchange | send (a post_send) | recv (a
                        // post_recv, shown when it takes time) | allreduce | allgather | wait
  std::string name;     // e.g. "vision transformer_layer x16 fwd", "exchange fwd wave 3"
  double start_ms = 0;
  double dur_ms = 0;
  int instr = 0;        // index in the device's program
  int wave = -1;        // forward, backward, exchange, send
  int slice = -1;       // forward, backward, send: index into Lowered::slices
  int bucket = -1;      // allreduce, allgather, wait (a bucket's all-reduce or all-gather): index into
                        // Lowered::buckets
  bool critical = false;   // on the critical path (SimOptions::critical_path): an instruction on it, or
                           // an all-reduce or all-gather on it, shown on the device that waited for it
  int64_t sent_bytes = 0;      // exchange, send, allreduce (the bucket's bytes), allgather
                               // (Lowered::gather_bytes)
  int64_t received_bytes = 0;  // exchange
};

// Where one device's time went. busy = compute + transfer + sync; every
// part is inside [0, finish_ms] and they do not overlap, so busy <= finish.
struct SimDevice {
  double compute_ms = 0;    // forward, backward, optimizer, norm_sum
  double transfer_ms = 0;   // inside its exchanges, while one of their messages moves or the
                            // device packs or unpacks (CostModel::overhead)
  double sync_ms = 0;       // its blocking all-reduces and all-gathers, from start to end; of a
                            // started one (allreduce_start, allgather_start), the part its wait was
                            // blocked on it (exposed)
  double wait_ms = 0;       // inside exchanges and collectives (or their waits) with nothing moving
  double hidden_sync_ms = 0;   // the rest of its started all-reduces and all-gathers: run while it
                               // did other work (not in busy_ms)
  double idle_ms = 0;       // iteration_ms - busy: waits plus the tail after finish_ms
  double finish_ms = 0;     // end of its last instruction
  double busy_ms() const { return compute_ms + transfer_ms + sync_ms; }
};

// One message (a Transfer between two devices), as simulated.
struct SimMessage {
  int transfer = 0;         // index into Lowered::transfers
  double ready_ms = 0;      // its sender reached the exchange (or post_send) and packed it
  double start_ms = 0;      // its links were free
  double end_ms = 0;        // delivered
};

// The critical path of a simulation: the chain of ends, each the one the
// next waited for last, back from the last device's end, and the makespan
// split along it (compute + transfer + sync = iteration_ms). Each end's
// part is the time from the end it waited for to its own.
struct SimPath {
  int device = -1;          // the last device to finish (ties: the lowest); -1: no instruction
  double compute_ms = 0;    // forward, backward, optimizer, norm_sum (all of it with communication priced at 0)
  double transfer_ms = 0;   // messages, packing and unpacking
  double sync_ms = 0;       // all-reduces, all-gathers and what they waited for in their members' polls
};

struct Simulation {
  double iteration_ms = 0;            // makespan: the last device's finish
  std::vector<SimDevice> devices;     // by device
  std::vector<SimBox> boxes;          // by device, then program order
  std::vector<SimMessage> messages;   // in order of start
  // simulate_plan: whether the plan lowered with the other bucket-start
  // rule would run other programs (Lowered::bucket_starts_matter); true
  // when not known (a simulation stopped before its programs were built).
  bool bucket_starts_matter = true;
  // With SimOptions::critical_path: the critical path (SimPath), and by
  // lowered slice whether the path runs through it (one of its forward or
  // backward instructions, a message into it, or an optimizer step of a
  // device's own unreduced shards on one of its devices). Shortening a slice
  // off the path cannot shorten the makespan unless it also changes what is
  // on the path (its operators' gradients in another bucket, other
  // messages): test_sim checks it with communication priced at 0.
  SimPath critical;
  std::vector<char> critical_slices;
  // Sums over devices (device-ms) of the parts of SimDevice.
  double compute_device_ms() const;
  double transfer_device_ms() const;
  double sync_device_ms() const;
  double hidden_sync_device_ms() const;
};

// The time of each slice of `lowered` from `plan`: lowered slice i is the
// i-th slice of plan.waves[].slices[] in order (lower() keeps that order).
std::vector<double> lowered_slice_ms(const Plan& plan);

// Simulates `lowered` with `slice_ms[i]` the forward + backward time of
// lowered slice i, `cost` for messages and all-reduces, and islands of
// `devices_per_island` (<= 0: one island). Errors when the programs cannot
// finish (an exchange or a collective waits for ever, which lowered programs
// never do) or slice_ms has the wrong size.
Result<Simulation> simulate(const Lowered& lowered, const std::vector<double>& slice_ms, const CostModel& cost,
                            int devices_per_island, const SimOptions& options = {});

// A lower bound on the makespan of `lowered` as simulate() prices it: the
// most any device is busy with its own compute (its slices' slice_ms) and
// collectives (allreduce_ms of each bucket it is in and, with sharded
// optimizer state, allgather_ms of its all-gather), which it runs one
// after another; with options.sync.overlap, where collectives run beside
// compute but still one after another, the all-reduces none before the
// device's forward pass is done: the larger of its compute and its
// forward compute plus all its collectives, or, when its all-gathers open
// the program (Lowered::gathers_at_start) and may run beside its forward
// pass, the largest of its compute, its forward compute plus its
// all-reduces, and all its collectives. Needs only lower_header's slices
// and buckets (and Lowered::sharded_state, gathers_at_start).
double device_lower_bound_ms(const Lowered& lowered, const std::vector<double>& slice_ms, const CostModel& cost,
                             const SimOptions& options = {});

// A lower bound on the makespan of `lowered`'s programs (lower_programs
// done) as simulate() prices them, at least device_lower_bound_ms: the most
// any device needs from its first instruction to its end, counting its
// compute one instruction after another, each blocking all-reduce and
// all-gather, each started one (allreduce_start, allgather_start) from its
// start to its wait and what follows that wait, and the collectives it
// starts (with sharded state: reaches) from any point on run one after
// another. A bounded simulation stops once a device's clock plus this
// figure from its current instruction passes the bound.
double program_lower_bound_ms(const Lowered& lowered, const std::vector<double>& slice_ms, const CostModel& cost,
                              const SimOptions& options = {});

// Lowers `plan` and simulates it: the plan's slice times, its
// devices_per_island, box names from its MetaOps. What the planner calls to
// cost every placed candidate: the makespan is its objective. With a finite
// stop_after_ms below device_lower_bound_ms, it returns the stopped result
// before building the programs.
Result<Simulation> simulate_plan(const Plan& plan, const Model& model, const OpGraph& graph, const CostModel& cost,
                                 const SimOptions& options = {});
// The same with the lowering's context made once (lower_context), for a
// caller that simulates many plans of one model.
Result<Simulation> simulate_plan(const Plan& plan, const LowerContext& context, const CostModel& cost,
                                 const SimOptions& options = {});

// What a simulation needs of the lowering (PlanSimulation lowers with it):
// the same instructions, transfers and buckets with `sync`, without what
// only readers and the executor use (LowerOptions::deps, runtime_maps).
LowerOptions simulation_lowering(const std::optional<GradSync>& sync = {});

// Simulations of one plan under several SimOptions on one lowering: each
// simulate(options) is simulate_plan(plan, context, cost, options), but the
// plan is lowered once, its header by the first call and its programs by
// the first call that needs them (one stopped by device_lower_bound_ms
// does not), and later calls reuse them. For a caller that simulates the
// same plan more than once (the planner's boundary shifts: makespan, then
// compute-only). Every options.sync given must equal `sync`, the
// lowering's (an error otherwise; an empty one means it); plan, context and cost must outlive it, and the plan
// must not change in between.
class PlanSimulation {
 public:
  PlanSimulation(const Plan& plan, const LowerContext& context, const CostModel& cost, const GradSync& sync);
  Result<Simulation> simulate(const SimOptions& options);

 private:
  const Plan& plan_;
  const LowerContext& context_;
  const CostModel& cost_;
  LowerOptions lite_;                       // what the simulation needs of the lowering
  std::optional<Result<Lowered>> lowered_;  // lower_header's, once made
  std::optional<Status> programs_;          // lower_programs', once run on *lowered_
  std::vector<double> slice_ms_;            // lowered_slice_ms(plan)
};

// The compute gap of `plan`: the makespan of its programs simulated with
// communication and optimizer steps priced at 0 (the relaxed optimum counts
// forward and backward alone; a slot that ends early hands its devices on)
// over plan.predicted.relaxed_optimum_ms, minus 1; 0 without an optimum.
// Negative when the plan beats the per-level optimum (start_early).
Result<double> simulated_compute_gap(const Plan& plan, const Model& model, const OpGraph& graph,
                                     const CostModel& cost);
// The same, with the lowering context the caller made once (lower_context).
Result<double> simulated_compute_gap(const Plan& plan, const LowerContext& context, const CostModel& cost);

}  // namespace spindle::plan
