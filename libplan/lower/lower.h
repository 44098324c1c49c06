// Lowering: a plan (docs/spec/plan.md) becomes one program per device, the
// ordered instructions that device runs in one training step (docs/lowering.md).
// spindle-run executes its rank's program; `spindle-plan --lower DIR` writes
// them for inspection; the byte counts a program states are the ones the
// runtime measures.
//
// Pure and deterministic: a function of (plan, model, graph) alone, so every
// rank and the planner compute the same programs.
//
// Each device's program, in order:
//   for every wave w:            [exchange forward w] forward of each of its slices of w
//   for every wave w, reversed:  backward of each of its slices of w (reversed) [exchange backward w],
//                                with overlap: after a backward, the start of every bucket whose
//                                gradients on this device are now final (and, with the plan's
//                                bucket starts in order, all before it started; Plan::bucket_starts)
//   with overlap (early transfers): right after a forward or backward, a post_send of what it made
//   for other devices (those sends are then in no exchange), and right after each exchange (the
//   first: at the start) a post_recv of the receives of the next exchange that has any; last, a
//   wait_sends for those sends' delivery
//   all-reduce of each gradient bucket it is in (buckets in one global order
//   chosen so that all-reduces over disjoint groups can run side by side);
//   with overlap: the wait for each, in that order, each followed by the
//   optimizer step of that bucket's shards and, when the plan shards the
//   optimizer state (ZeRO-1, Plan::optimizer_state), the all-gather of the
//   values stepped (each member steps its own chunk: rules/memory.h,
//   owned_values)
//   optimizer (every shard not stepped above); without overlap, sharded,
//   then the all-gather of each bucket it is in, in the global order
//   with GradSync::grad_norm: a norm_sum and a grad_norm after the last
//   all-reduce (or wait), and every optimizer step (with its all-gather)
//   after them
//   last (before wait_sends), on plans with tensor-parallel parameters
//   whose copies do not step alike: the copy exchange (Direction::copy), in
//   which every copy at a TP rank above 0 of a tensor whole on every TP
//   rank takes TP rank 0's stepped values
//   (with the values' all-gathers at the next step's start, each member
//   sends and takes only its own chunk, which those gathers then spread)
// With overlap and sharded optimizer state, when the plan says next_step
// (Plan::param_gather), the values' all-gathers move to the start of the
// next step instead (Megatron's overlap_param_gather):
// the program opens with an allgather_start of every bucket it is in (in
// the gather order: by the bucket's first wave, then its index) and waits
// for each (allgather_wait), in that order, right before the first forward
// that uses one of its parameters or of a bucket gathered after it, so each
// gather overlaps the forwards before that one.
// The step's own optimizer steps then leave every member holding its own
// chunk stepped and the rest of the bucket's values from before the step,
// until the next step's gathers (or Executor::gather_values, before a
// checkpoint, an evaluation or the parameters' export).
// An exchange is every transfer of one wave and direction that this device
// sends or receives (or copies locally), posted together; a device with no
// transfer in that exchange has no instruction for it. Because every device
// follows the same global order of exchanges and collectives, blocking
// execution of the programs cannot deadlock; a started all-reduce does not
// block, and its wait comes after every exchange (started when ready, two
// devices may start two buckets in different orders: each bucket then
// needs a communicator of its own, which spindle-run makes). A post_send or post_recv
// does not block either: an exchange waits for its receives (and for the
// sends it posts itself), a send posted early is waited for at the end of
// the program (wait_sends), and it is posted no later than the exchange that would
// otherwise have sent it, so early posting removes waits and adds none.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "libplan/graph/op_graph.h"
#include "libplan/model/model.h"
#include "libplan/model/ops.h"
#include "libplan/plan/plan.h"
#include "libplan/rules/links.h"
#include "libplan/rules/memory.h"
#include "libplan/rules/rows.h"
#include "libplan/util/status.h"
#include "libplan/util/units.h"

namespace spindle::plan {

inline constexpr int kProgramVersion = 11;   // 2: allreduce_start, allreduce_wait; 3: a bucket's optimizer step;
                                            // 4: post_send, post_recv, wait_sends (transfers posted early);
                                            // 5: an optimizer step's values; 6: a backward piece's "adds"
                                            // 7: allgather (ZeRO-1), a bucket's optimizer step over its own chunk
                                            // 8: allgather_start, allgather_wait (ZeRO-1 with overlap)
                                            // 9: grad_norm (GradSync::grad_norm)
                                            // 10: norm_sum before grad_norm, with the values it reads
                                            // 11: the copy exchange (Direction::copy: TP copies kept equal)

// kWireBytesPerValue (rules/links.h): what one value costs on the wire.

// One slice of the plan as the programs see it.
struct LoweredSlice {
  int wave = 0;
  int metaop = 0;
  std::vector<int> ops;        // graph operator indices, in chain order
  std::vector<int> devices;    // ascending
  RowLayout layout;            // batch, n, tensor_parallel
  std::vector<int> producers;  // graph operators feeding ops[0], in the node's input order
};

// forward and backward: activations and their gradients between slices.
// copy: the tensor-parallel copies of replicated tensors, last in each
// step (Lowered::transfers, "Tensor-parallel copies" in docs/runtime.md).
enum class Direction : uint8_t { forward, backward, copy };
// "fwd", "bwd", "copy": as the trace names exchanges.
inline const char* short_name(Direction d) {
  return d == Direction::forward ? "fwd" : d == Direction::backward ? "bwd" : "copy";
}

// One piece of a re-sharding between two slices: rows of `producer`'s output
// (forward) or of its output gradient (backward) move from device src to
// device dst (src == dst: a local copy, no message).
//
// A copy (Direction::copy) moves parameter values instead: of the tensors
// of tensor-parallel parameters that every TP rank holds whole (their
// LayerNorm gains and biases, row-parallel biases: shard_axis -1), TP rank
// 0's shards on src, as stepped this step, into the shards of TP rank
// `slice` (> 0) on dst. What it moves is a run of pieces,
// Lowered::copy_runs[input]: each a range of one parameter's whole
// tensors laid end to end (LowerContext::copy_values of them, in the
// order of its tensors), the pieces one after another in its `rows` [0,
// values) (for_each_copied_param). `producer` is the first piece's
// operator, `wave` -1. So every copy holds TP rank 0's values after every
// step, whichever groupings the plan sums their gradients in.
struct Transfer {
  Direction dir = Direction::forward;
  // Backward only, at dst: the piece is added into the producer's output
  // gradient there. false: it becomes that gradient as it is (no buffer
  // zeroed, nothing added): the first piece of the producer's gradient on
  // dst in dst's program order, covering all of dst's rows of the
  // producer. Set by lower_programs; the executor and the simulation
  // follow it. (Beside dir: no padding, 64 bytes in all.)
  bool adds = true;
  int wave = 0;        // the exchange it belongs to: the consumer slice's wave
  int slice = 0;       // consumer slice (index into Lowered::slices)
  int input = 0;       // index into the consumer slice's producers
  int producer = 0;    // graph operator whose output (gradient) moves
  int src = 0, dst = 0;
  RowRange rows;       // absolute batch rows
  int64_t values = 0;  // rows x values per row
  int64_t bytes = 0;   // values x kWireBytesPerValue; 0 for a local copy
  bool operator==(const Transfer&) const = default;
};
static_assert(sizeof(Transfer) <= 64, "Transfer: one cache line at most (see above)");

// One parameter shard: the parameter "M/k.r" at one tensor-parallel rank.
using ShardKey = std::pair<std::string, int>;

// Gradients summed together over one device group: every shard whose
// holders are exactly `devices`, in key order.
struct Bucket {
  std::vector<int> devices;     // ascending, at least 2
  std::vector<ShardKey> shards; // ascending; empty without LowerOptions::runtime_maps (params say the same)
  std::vector<int> params;      // by shard: its parameter id (LowerContext::params)
  std::vector<int> ranks;       // by shard: its tensor-parallel rank
  int first_wave = 0;           // the earliest wave using one of them: their gradients are final once
                                // the backward pass is past it
  int64_t values = 0;           // gradient values summed: op_shard_param_count of each shard
  int64_t bytes = 0;            // values x kWireBytesPerValue
  bool operator==(const Bucket&) const = default;
};

// allreduce: a blocking all-reduce of a gradient bucket (every bucket after
// the backward pass: LowerOptions::overlap false). allreduce_start starts
// one without waiting (as soon as this device's gradients of the bucket
// are final, during the backward pass) and allreduce_wait waits for it
// (before the optimizer): the reduction overlaps the backward pass.
//
// post_send posts, without waiting, this device's sends of the rows a
// forward (or backward) it just ran made for other devices, each tagged
// with its transfer index; post_recv posts, without waiting, the receives
// of its next exchange that has any (the exchange then waits for them).
// wait_sends, last, waits until every send of its post_sends has been
// delivered.
//
// allgather (plans with the optimizer state sharded, ZeRO-1, without
// overlap): a blocking all-gather over the bucket's devices of the values
// each just stepped, after the bucket's optimizer step; every member then
// holds every value of the bucket's shards again. With overlap the same
// all-gather runs at the next step's start instead: allgather_start (first
// in the program) starts it without waiting, allgather_wait (right before
// the first forward using one of the bucket's parameters) waits for it.
//
// norm_sum and grad_norm (GradSync::grad_norm: runs that clip
// gradients), after every all-reduce of the device's buckets and before
// its first optimizer step: norm_sum adds up the squares of the gradient
// values this device counts in the global norm (Lowered::norm_values, the
// instruction's `values`); grad_norm is the global L2 norm of the step's
// gradients, a blocking all-reduce over every device of that one sum
// (kNormBytes). Each optimizer step then scales its gradients by the
// clipping factor (docs/runtime.md, "Gradient clipping").
enum class InstrKind : uint8_t {
  exchange, forward, backward, allreduce, allreduce_start, allreduce_wait, optimizer, post_send, post_recv,
  wait_sends, allgather, allgather_start, allgather_wait, grad_norm, norm_sum
};

// 32 bytes: the simulation reads thousands of them per candidate plan, so
// what it does not read (the dependencies) is kept beside them in the
// Program, and the fields are ordered without padding.
struct Instr {
  InstrKind kind = InstrKind::forward;
  Direction dir = Direction::forward;  // exchange, post_send, post_recv
  int wave = -1;               // exchange, forward, backward, post_send (the slice's wave), post_recv
                               // (the exchange's)
  int slice = -1;              // forward, backward, post_send (the slice whose compute made the rows):
                               // index into Lowered::slices
  // exchange, post_send, post_recv: the transfers this device takes part
  // in, as the range [transfers_begin, transfers_end) of Program::transfers
  // (Program::transfers_of). An exchange's are those it sends (none with
  // early transfers), receives or copies; a post_send's those it sends; a
  // post_recv's those it receives (again in their exchange).
  int transfers_begin = 0, transfers_end = 0;
  int bucket = -1;             // allreduce, allreduce_start, allreduce_wait, allgather, allgather_start,
                               // allgather_wait: index into
                               // Lowered::buckets; optimizer: the bucket whose shards it steps, -1:
                               // every shard of this device in no bucket stepped before
  int64_t values = 0;          // optimizer: the parameter values it steps (op_shard_param_count of
                               // each shard, or with sharded state this device's chunk of the
                               // bucket, Lowered::owned; CostModel::optimizer_ms prices them);
                               // norm_sum: the gradient values it reads (Lowered::norm_values;
                               // CostModel::norm_sum_ms prices them)
  bool operator==(const Instr&) const = default;
};
static_assert(sizeof(Instr) <= 32, "Instr: 32 bytes at most (see above)");

struct Program {
  int device = 0;
  std::vector<Instr> instrs;
  // The transfers of every exchange, post_send and post_recv, in program
  // order: indices into Lowered::transfers (one list per program, not per
  // instruction).
  std::vector<int> transfers;
  std::span<const int> transfers_of(const Instr& in) const {
    return {transfers.data() + in.transfers_begin, transfers.data() + in.transfers_end};
  }
  // By instruction: the instructions of this program that must be done
  // before it, ascending (LowerOptions::deps; empty, for every
  // instruction, without).
  std::vector<std::vector<int>> deps;
  bool operator==(const Program&) const = default;
};

// What one device sends and receives in one step, bytes.
struct ProgramBytes {
  int64_t sent = 0;       // transfers to other devices (the copies' too: Direction::copy)
  int64_t received = 0;   // transfers from other devices
  int64_t reduced = 0;    // gradient all-reduce payload (each bucket's bytes once; with sharded state its
                          // reduce-scatter's, Lowered::gather_bytes)
  int64_t gathered = 0;   // ZeRO-1 all-gather payload (each bucket's Lowered::gather_bytes once)
  bool operator==(const ProgramBytes&) const = default;
};

// Parameter ids: every distinct Operator::param of the graph, numbered in
// order of first appearance; -1 for an operator without parameters
// (contrastive_loss). Lowering works on these ints, not on the strings.
struct ParamIds {
  std::vector<int> of_op;            // by graph operator
  std::vector<std::string> names;    // by id
  std::vector<int> sorted;           // ids in order of name
};

// What lowering takes from the model and its graph alone, worked out once
// by lower_context and shared by every lowering of plans for them (the
// planner lowers a dozen candidates per planning). Points into the model
// and the graph, which must outlive it; read-only, so threads may share it.
struct LowerContext {
  const Model* model = nullptr;
  const OpGraph* graph = nullptr;
  ParamIds params;
  // By graph operator: the operators feeding it, in its inputs' order (the
  // first operator of a node reads the last operators of its input nodes).
  std::vector<std::vector<int>> producers;
  // By graph operator: the values of its parameter shard
  // (op_shard_param_count with its module's max_seq and its
  // tensor_parallel); 0 for an operator without parameters.
  std::vector<int64_t> shard_values;
  // By graph operator: the values of one batch row of its output
  // (op_out_values_per_sample).
  std::vector<int64_t> out_values_per_row;
  // By parameter id: its tensors at one tensor-parallel rank, in the order
  // of a bucket's flat layout (op_param_tensors): the values of each and
  // its split axis (-1: whole on every TP rank, so that TP ranks other than
  // 0 leave their copy out of the gradient norm: tp_copy_counts).
  // Lowered::norm_values.
  struct NormTensor {
    int64_t values = 0;
    int shard_axis = -1;   // op_param_tensors'; tp_copy_counts
  };
  std::vector<std::vector<NormTensor>> param_tensors;
  // By parameter id: with tensor_parallel > 1, the values of its tensors
  // whole on every TP rank (shard_axis -1), which copies keep equal
  // (Direction::copy); else 0.
  std::vector<int64_t> copy_values;
  std::unordered_map<std::string_view, int> op_index;   // operator id -> graph index
};

// Errors when `graph` is not the expansion of `model` (an operator of a
// task or node the model lacks, an input that is no node).
Result<LowerContext> lower_context(const Model& model, const OpGraph& graph);

struct Lowered {
  int devices = 0;
  std::vector<LoweredSlice> slices;      // wave by wave, in plan order
  std::vector<int> slice_of;             // graph operator -> slice
  std::vector<Transfer> transfers;       // forward waves ascending, then backward waves descending,
                                         // then the copies (lower_copies in lower.cpp)
  // The pieces of each copy (Transfer::input of a copy): values [begin,
  // end) of the whole tensors of the parameter that operator `op` uses,
  // laid end to end; parameters in name order.
  struct CopyPiece {
    int op = 0;
    int64_t begin = 0, end = 0;
    bool operator==(const CopyPiece&) const = default;
  };
  std::vector<std::vector<CopyPiece>> copy_runs;
  // Set by lower_header for lower_copies: each parameter with values to
  // copy (LowerContext::copy_values) whose copies do not step alike
  // (copies_step_alike in lower.cpp), in name order: its id, an operator
  // using it, and its holders by TP rank (each ascending).
  struct CopyHolders {
    int param = 0, op = 0;
    std::vector<std::vector<int>> by_rank;
  };
  std::vector<CopyHolders> copy_holders;
  std::vector<Bucket> buckets;           // in the one order every device runs them (lower.cpp, order_buckets)
  // By device: the values of the parameter shards it alone holds (no
  // all-reduce), which its last optimizer step steps; and of those, the
  // ones it counts in the gradient norm (norm_values).
  std::vector<int64_t> unreduced_values, unreduced_norm_values;
  // Every parameter shard: the devices holding it (ascending), its
  // tensor-parallel degree, and one operator using it.
  std::map<ShardKey, std::vector<int>> shard_devices;
  std::map<std::string, int> param_tp;
  std::map<std::string, int> param_op;
  std::vector<Program> programs;         // by device
  // With overlap: whether the other bucket-start rule (Plan::bucket_starts)
  // would lower other programs: on some device a bucket is ready before
  // one ahead of it in the global order, so in order holds it back. When
  // false the two rules give the same programs (set by lower_programs).
  bool bucket_starts_matter = false;

  // Whether each bucket's members hold and step their own chunk of its
  // optimizer state and all-gather the values after (ZeRO-1): the plan's
  // optimizer_state is sharded (rules/memory.h).
  bool sharded_state = false;
  // With sharded_state, overlap and Plan::param_gather next_step: the
  // values' all-gathers open each program (allgather_start) instead of
  // following the buckets' optimizer steps (allgather). Set by lower_header.
  bool gathers_at_start = false;
  // Whether every program computes the global gradient norm (a norm_sum
  // and a grad_norm instruction each; GradSync::grad_norm), and then every
  // device, in order: the group of that all-reduce. Set by lower_programs.
  bool grad_norm = false;
  std::vector<int> all_devices;

  // The gradient norm counts each parameter value once. Whether `device`
  // adds up the squares of its gradients of parameter shard `key` (one it
  // holds): with sharded_state every holder adds its own chunk (owned:
  // after the reduce-scatter it holds the sum of that chunk alone); else
  // the shard's first holder adds all of it. Needs
  // LowerOptions::runtime_maps (shard_devices).
  bool counts_in_norm(const ShardKey& key, int device) const;
  // The same for any shard whose holders (ascending) are `holders`: the
  // rule counts_in_norm and norm_values share.
  bool counts_holders_in_norm(const std::vector<int>& holders, int device) const;
  // The gradient values `device` adds to the norm (its norm_sum's values),
  // by the same rule: of each bucket it is in, its own chunk with
  // sharded_state, else all of the bucket's values when it is the bucket's
  // first device (every shard of a bucket has the bucket's holders); and
  // its shards in no bucket. Of a shard at TP rank > 0, its copies of the
  // tensors whole on every TP rank are left out (counted at rank 0:
  // LowerContext::NormTensor). Over every device they add up to every
  // parameter value of the model once. `context` is the one lowered with.
  int64_t norm_values(int device, const LowerContext& context) const;

  // Position of `device` in slice `slice`'s device list; -1 when absent.
  int position(int slice, int device) const;
  ProgramBytes bytes(int device) const;
  // With sharded_state: the values of bucket `bucket`'s flat buffer that
  // `device` (one of its members) steps (owned_values at its place in the
  // bucket's devices); else all of them.
  ValueRange owned(int bucket, int device) const;
  // The floats of bucket `bucket`'s flat buffer: its values, padded with
  // sharded_state to members x owned_chunk (equal chunks, for its
  // reduce-scatter and all-gather).
  int64_t flat_values(int bucket) const;
  // With sharded_state: the bytes bucket `bucket`'s reduce-scatter and
  // all-gather each move, flat_values x kWireBytesPerValue; else 0.
  int64_t gather_bytes(int bucket) const;
};

// Of copy `t` (Direction::copy) of `l`: fn(op, begin, end, at) for each
// of its pieces, in order: values [begin, end) of the whole tensors of the
// parameter `op` uses, `at` the first one's place among t's values.
template <class Fn>
void for_each_copied_param(const Lowered& l, const Transfer& t, Fn fn) {
  int64_t at = 0;
  for (const Lowered::CopyPiece& piece : l.copy_runs[static_cast<size_t>(t.input)]) {
    fn(piece.op, piece.begin, piece.end, at);
    at += piece.end - piece.begin;
  }
}

// Lowers `plan` for `model` (whose expanded graph is `graph`). The plan must
// name the model's operators; errors name the plan and the offending slice
// or operator (a plan that passed check_plan_status lowers without error).
// How gradients are synchronised; the planner, the simulation and
// spindle-run must use the same: spindle-plan records its --no-overlap and
// --bucket-mb in the plan (Plan::overlap, Plan::bucket_bytes) and
// spindle-run lowers with them (planned_sync, sync_for_run).
struct GradSync {
  // Gradient all-reduces overlap the backward pass (allreduce_start as
  // early as the bucket's gradients allow, allreduce_wait before the
  // optimizer); false: a blocking allreduce per bucket after the backward
  // pass (--no-overlap).
  bool overlap = true;
  // A bucket (the shards with one holder set) is cut into pieces of at most
  // this many bytes, in the order their gradients become final (latest wave
  // first), as PyTorch DDP cuts its buckets (bucket_cap_mb, 25 MiB by
  // default); a shard larger than this is a piece alone. --bucket-mb.
  int64_t bucket_bytes = kDefaultBucketBytes;
  // With overlap, transfers are posted early as well: each device posts
  // its sends right after the compute that made the rows (post_send) and
  // the receives of an exchange right after the exchange before it
  // (post_recv), when the plan also says so (Plan::early_transfers).
  // false keeps every send in its exchange: --no-early-transfers, and what
  // spindle-run lowers for NCCL, whose point-to-point calls it does not yet
  // run on a stream of their own (docs/gpu.md).
  bool early_transfers = true;
  // Every device's optimizer steps wait for the global gradient norm (a
  // norm_sum and a grad_norm after its all-reduces), which spindle-run
  // --clip-grad needs; recorded in the plan (Plan::grad_norm,
  // spindle-plan --grad-norm).
  bool grad_norm = false;
  bool operator==(const GradSync&) const = default;
};

// What one grad_norm all-reduce moves: one fp32 value (a device's share of
// the sum of squares). In no ProgramBytes figure, as the runtime counts it
// in no StepCounters byte count.
inline constexpr int64_t kNormBytes = kWireBytesPerValue;

// --bucket-mb: an error naming the flag unless `mb` is in [kMinBucketMb,
// kMaxBucketMb] (plan.h; NaN is not); and its value in bytes (at least 1),
// the nearest whole byte (0.001 MiB is 1049 bytes, which reads back as
// 0.001 MiB; cut down to 1048 it was echoed as 0.000999).
inline Status check_bucket_mb(double mb) {
  if (mb >= kMinBucketMb && mb <= kMaxBucketMb) return {};
  return Error{"--bucket-mb " + number_text(mb) + ": expected MiB in [" + number_text(kMinBucketMb) + ", " +
               number_text(kMaxBucketMb) + "]"};
}
inline int64_t bucket_bytes_of_mb(double mb) {
  return std::max<int64_t>(1, std::llround(std::clamp(mb, kMinBucketMb, kMaxBucketMb) * (1 << 20)));
}

// Whether Plan::param_gather changes the programs of `plan` lowered with
// `sync`: only with its optimizer state sharded and gradients overlapped
// (otherwise the values are gathered after the step, or not at all).
inline bool param_gather_applies(const Plan& plan, const GradSync& sync) {
  return plan.optimizer_state == OptimizerState::sharded && sync.overlap;
}

// The GradSync `plan` was made and simulated with (Plan::overlap,
// Plan::bucket_bytes; early transfers as the plan says,
// Plan::early_transfers): what spindle-run and `spindle-plan --check
// --lower` lower unless a flag overrides it.
inline GradSync planned_sync(const Plan& plan) {
  GradSync sync;
  sync.overlap = plan.overlap;
  sync.bucket_bytes = plan.bucket_bytes;
  sync.grad_norm = plan.grad_norm;
  return sync;
}

// The sync flags a command line gave (spindle-run, spindle-plan --check);
// a flag not given leaves the plan's choice.
struct SyncFlags {
  bool no_overlap = false;             // --no-overlap
  bool no_early_transfers = false;     // --no-early-transfers
  std::optional<int64_t> bucket_bytes; // --bucket-mb, when given
  bool grad_norm = false;              // spindle-run --clip-grad: the programs need the gradient norm
};
// planned_sync(plan) with each given flag in place of its part. Appends to
// `notes` a line for each flag that makes the run lower other programs
// than the planner simulated (its predictions then describe another run).
GradSync sync_for_run(const Plan& plan, const SyncFlags& flags, std::vector<std::string>& notes);

// What lower() fills beyond the instructions every consumer needs.
struct LowerOptions {
  bool deps = true;           // Program::deps (what --lower shows; the executor and the simulation run in order)
  bool runtime_maps = true;   // Lowered::shard_devices, param_tp, param_op, Bucket::shards (the executor's)
  // How gradients are synchronised; empty: as the plan says (planned_sync:
  // its overlap and bucket cap, what spindle-run given no flag lowers).
  std::optional<GradSync> sync;
  // false: no copy exchange (Lowered's Direction::copy transfers and the
  // exchange that moves them), so the tensor-parallel copies of replicated
  // tensors drift apart by rounding. For tests alone: the drift detector's
  // positive control (spindle-run's SPINDLE_TEST_NO_TP_COPIES).
  bool copies = true;
};

Result<Lowered> lower(const Plan& plan, const Model& model, const OpGraph& graph, const LowerOptions& options = {});

// lower() in two stages with a context made once, for a caller that lowers
// many plans or may stop after the first stage (the simulation's lower
// bound needs only the slices and buckets): lower_header fills devices,
// slices, slice_of, buckets (and the runtime maps); lower_programs then adds
// the transfers and the programs.
Result<Lowered> lower_header(const Plan& plan, const LowerContext& context, const LowerOptions& options = {});
Status lower_programs(const Plan& plan, const LowerContext& context, Lowered& header,
                      const LowerOptions& options = {});

// The programs as versioned JSON (docs/lowering.md): one document per
// device, {"format": "spindle-program", "version": kProgramVersion, "device": d, ...}.
std::string program_json(const Lowered& lowered, const OpGraph& graph, int device);

}  // namespace spindle::plan
