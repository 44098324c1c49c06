// The executor: runs this rank's program of a lowered wave plan
// (libplan/lower/lower.h, docs/lowering.md), training exactly as one device
// would (docs/runtime.md).
//
// Each rank of `world` drives device = rank. Per step it runs its program:
// forward over the waves (activations re-sharded between slices), backward
// over the waves reversed (gradients re-sharded back), gradient all-reduce
// per bucket, AdamW step, then the copy of TP rank 0's replicated tensors
// into the other TP ranks' copies (lower.h, Direction::copy). Transfers and
// sync groups come from the lowering; the executor derives none itself.
// Gradients are scaled so that the all-reduced sum equals single-device
// training on the whole batch:
//   - lm_loss returns the mean over its local rows' counted tokens (targets
//     -1 are ignored); a data-parallel group whose rows hold c of the C
//     counted tokens of the whole task batch back-propagates weight * c / C
//     (C by an all-reduce over the slice when the data can ignore tokens,
//     else c / C = b / B for b of the B rows);
//   - contrastive_loss all-gathers its slice's embeddings, computes the
//     full-batch loss on every device, back-propagates weight, and keeps only
//     the gradient rows of its own group (the encoders are row-wise, so the
//     sum over devices is exact).
// Parameter storage is keyed by (parameter "M/k.r", TP rank): a device may
// run the same TP module at different TP ranks in different slices. Each
// (parameter, TP rank) is all-reduced over exactly the devices that hold that
// shard at that rank (for K = 1 this is the plan's param_groups entry).
//
// Memory: parameters, gradients and AdamW moments are allocated through the
// backend at construction and stay in its memory; activations and their
// gradients stay where the backend produced them, and output gradients that
// several consumers send are added up there (Backend::add). Host memory only
// where data crosses a host-buffer Comm (transfers to other ranks unless
// `world` is an NcclComm with a CUDA backend, the contrastive all-gather,
// gradient all-reduce unless the group is NCCL), and for checkpoints, losses
// and synthetic data (docs/gpu.md, "What the executor does on a device").
//
// Blocking communication is deadlock-free by construction: every rank walks
// the same global sequence (each wave's transfers as one exchange, in which
// this rank's sends and receives complete in any order, then the wave's
// slices, whose collectives stay inside disjoint groups; gradient buckets in
// the lowering's one global order), so the earliest unfinished exchange
// always has all parties. Sends and receives posted early (overlap) never
// block, and a send is posted no later than its exchange would have sent
// it, so they add no wait.
//
// Errors: a plan that does not match the model or world throws
// std::invalid_argument from the constructor; communication errors abort the
// job (comm.h). Not thread-safe.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "libexec/backend/backend.h"
#include "libexec/comm/comm.h"
#include "libexec/data/source.h"
#include "libexec/exec/checkpoint.h"
#include "libexec/optim/adamw.h"
#include "libplan/report/trace.h"
#include "libplan/model/model.h"
#include "libplan/lower/lower.h"
#include "libplan/plan/plan.h"

namespace spindle::exec {

// Communicators of device groups, keyed by the ascending device list (as
// create_group_comms returns them); the group rank of device d is its
// position in the list.
using GroupComms = std::map<std::vector<int>, std::unique_ptr<Comm>>;

struct ExecOptions {
  uint64_t seed = 0;  // parameters and synthetic data (same seed, same run on any plan)
  // AdamW for tiny models: lr 3e-3, weight decay 0.01.
  AdamWConfig adamw{3e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  bool record_trace = false;  // keep measured boxes for trace()
  // Of those, only the boxes of steps trace_first_step to trace_last_step
  // (as steps_done() counts them once the step has begun, from 1; an
  // evaluation's with the step it follows). The default: every step.
  int64_t trace_first_step = 1;
  int64_t trace_last_step = std::numeric_limits<int64_t>::max();
  // Gradient all-reduces start during the backward pass and are waited for
  // before the optimizer, in buckets of at most 25 MiB (plan::GradSync);
  // sync.overlap false: each after the backward pass, blocking (spindle-run
  // --no-overlap). The sums are bitwise the same either way.
  plan::GradSync sync = {};
  // Host threads that seed the parameters at start and draw the synthetic
  // training data of one read (the default data); the values are the same
  // for any count. One on the CPU backend, whose ranks already take a core
  // each; spindle-run gives a CUDA rank its node's cores over its ranks
  // there (host_threads_for, backend.h). Fewer than 1 counts as 1.
  int host_threads = 1;
  // Gradient clipping (spindle-run --clip-grad): when > 0, each step
  // scales every gradient by min(1, clip_grad / (norm + 1e-6)) before
  // AdamW, norm being the global L2 norm of the step's gradients (PyTorch's
  // clip_grad_norm_, Megatron's --clip-grad). Needs sync.grad_norm (the
  // programs then compute the norm); 0: no clipping.
  double clip_grad = 0;
  // Weight decay on 1-D tensors too (biases, LayerNorm gains and biases):
  // the default, docs/spec/ops.md. false: AdamW steps them without weight
  // decay, as Megatron-LM does by default (spindle-run --no-weight-decay-1d);
  // a property of the full tensor, so the same on every plan.
  bool decay_1d = true;
  // false: the programs without their copy exchange (plan::LowerOptions::
  // copies), so the TP copies of replicated tensors drift apart. A test
  // hook alone (spindle-run's SPINDLE_TEST_NO_TP_COPIES=1): gather_state's
  // drift must then see them differ.
  bool tp_copies = true;
};

// What this rank did in one step, by phase of its lowered program. Bytes
// are those of the buffers it handed to its communicators (fp32), the same
// figures the lowering predicts (plan::Lowered::bytes). Times are host wall
// time; with a device backend they include only what the host waited for
// (launches are asynchronous) unless the trace is recorded, which
// synchronises after every box.
struct StepCounters {
  int64_t sent_bytes = 0;       // inter-wave transfers (and TP copies: Direction::copy) to other ranks
  int64_t received_bytes = 0;   // the same from other ranks
  int64_t reduced_bytes = 0;    // gradient all-reduce payload, summed over buckets
  int64_t gathered_bytes = 0;   // ZeRO-1 parameter all-gather payload (received buffer), summed over buckets
  double compute_ms = 0;        // forward, backward, optimizer (its norm_sum too)
  double transfer_ms = 0;       // exchanges (packing, messages, unpacking)
  double sync_ms = 0;           // gradient all-reduce: starting and waiting (not the polls between);
                                // ZeRO-1 all-gathers
  int64_t peak_bytes = 0;       // the backend's memory in use at most during the step (Backend::peak_bytes)
};

struct StepStats {
  int64_t step = 0;                // 1-based
  std::vector<double> task_loss;   // per model task (model order): sum of weight * loss, full batch
  double step_ms = 0;              // this rank's wall time of the step, milliseconds
  StepCounters counters;           // this rank's
  // By instruction of this rank's program (Executor::lowered().programs[rank]), its wall
  // time in the step, ms (host time, as the counters; what
  // spindle-profile --measure fits the executor's overhead from).
  std::vector<double> instr_ms;
  // The global L2 norm of the step's gradients, before clipping, the same
  // on every rank; empty when the programs compute none
  // (ExecOptions::sync.grad_norm false).
  std::optional<double> grad_norm;
};

// One forward-only pass over one batch (Executor::evaluate), reduced over
// world: every rank returns the same values. Per model task:
struct EvalStats {
  std::vector<double> task_loss;  // unweighted loss of the batch (sum over the task's losses)
  // Top-1 retrieval hits of the task's contrastive_loss nodes within the
  // batch (eval.h), first input's rows as queries against the second's, and
  // back; queries: rows asked per direction (0 when the task has none).
  std::vector<double> hits_ab, hits_ba, queries;
};

// Parameter tensors of this rank set by Executor::load_state.
struct LoadCounts {
  int64_t carried = 0;  // taken from the state (their shard of the full tensor)
  int64_t fresh = 0;    // absent from the state: seeded initial value, zero moments
};

struct Schedule;  // executor.cpp: the graph and the lowered programs

class Executor {
 public:
  // Every device group the executor communicates in (each slice's devices,
  // each TP group, each gradient sync group), sorted, without duplicates.
  // Pure: every rank computes the same list. Throws std::invalid_argument
  // when the plan does not fit the model (unknown operator ids).
  static std::vector<std::vector<int>> device_groups(const plan::Model& model,
                                                     const plan::Plan& plan);

  // `model` and `plan` must have passed check_plan_status; `model` must
  // outlive the executor (the plan is lowered here and not kept).
  // world.size() == plan.devices (else std::invalid_argument).
  // `groups` holds the communicators of the groups of device_groups() that
  // contain world.rank(). `backend` runs the operators.
  Executor(const plan::Model& model, const plan::Plan& plan, Comm& world, GroupComms groups,
           Backend& backend, ExecOptions options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // One synchronous training step; collective over world. Losses are
  // reduced over world: every rank returns the same task_loss.
  StepStats step();

  // The training data: step s reads batch s - 1 of `source` (not owned; it
  // must outlive the executor's steps). Default (nullptr): the synthetic
  // data of data.h with options.seed.
  void set_data(DataSource* source);

  // AdamW's learning rate from the next step on (options.adamw.lr until
  // then): spindle-run sets each step's rate of its schedule
  // (optim/lr_schedule.h) before the step.
  void set_learning_rate(float lr) { options_.adamw.lr = lr; }
  float learning_rate() const { return options_.adamw.lr; }
  const AdamWConfig& adamw() const { return options_.adamw; }

  // What this rank reads per batch: one entry per data-reading operator of
  // its slices, with this device's rows; with `labels`, also the whole
  // batch's labels for each contrastive_loss slice it leads. Pure.
  std::vector<DataRead> data_reads(bool labels) const;

  // Forward only, batch `batch` of `source`, on the same plan: no
  // gradients, no optimizer step, steps_done() unchanged. Collective over
  // world (the same batch on every rank).
  EvalStats evaluate(DataSource& source, int64_t batch);

  // Measured boxes of this rank (device = rank), microseconds since the
  // clock origin; empty unless options.record_trace. Named and given their
  // args here, from the compact records the steps kept.
  std::vector<plan::TraceEvent> trace() const;
  // Sets the trace clock origin to now (call right after a world barrier).
  void reset_clock() { origin_ = Clock::now(); }

  // Every full parameter tensor ("M/k.r/<tensor>" -> value, TP shards
  // reassembled), on rank 0; other ranks return an empty map. Collective
  // over world.
  // With `drift`, also gather_state's TrainingState::drift (rank 0's).
  std::map<std::string, Tensor> gather_params(ReplicaDrift* drift = nullptr);

  // Every full parameter gradient of the last step() ("M/k.r/<tensor>" ->
  // the gradient after the gradient sync, the one AdamW used, before the
  // clipping factor AdamW applies (ExecOptions::clip_grad): the
  // full-batch gradient, TP shards reassembled), on rank 0; other ranks
  // return an empty map. Valid after step() until the next step(). A test
  // hook (spindle-run --dump-grads): gradients, unlike parameters after
  // AdamW, show a uniform scale error. Collective over world.
  std::map<std::string, Tensor> gather_grads();

  // The full training state (values, AdamW moments and step counts of every
  // parameter tensor, TP shards reassembled; step = steps_done()) on rank 0;
  // other ranks get only `step`. Collective over world.
  // Also, on rank 0, how far the TP copies of replicated tensors are from
  // TP rank 0's (TrainingState::drift): rank 0 receives every copy anyway.
  TrainingState gather_state();
  // The same a parameter at a time, each part (0 value, 1 AdamW m, 2 v) to
  // the rank `to` names for it: there `sink` gets each full tensor's part
  // (name, part, values, AdamW steps) once its parameter's shards are all
  // in, and then the rank lets it go, so that it holds one parameter's
  // parts at a time (a checkpoint of a large model is written as it
  // arrives, each file by its own rank: CheckpointWriter), not the model's.
  // `drift` (on the rank of the values) as above. Other ranks send
  // theirs; `sink` is called on the ranks `to` names alone. The tensor
  // `sink` gets may be a view of this rank's own parameters and moments:
  // read it before step() runs again. Collective over world.
  using StatePartSink =
      std::function<void(const std::string& name, int part, const Tensor& full, int64_t adam_steps)>;
  void gather_state(const StatePartSink& sink, const std::array<int, 3>& to, ReplicaDrift* drift);

  // Replaces this rank's parameters and optimizer state with its shards of
  // `state` (any plan and device count wrote it) and sets steps_done() to
  // state.step. Tensors the state lacks keep their seeded initial value with
  // zero moments and restart AdamW's bias correction; tensors of the state
  // this model lacks are ignored. Throws std::invalid_argument when a tensor
  // of the state has another full shape than the model's. Local, no
  // communication; call on every rank before step().
  LoadCounts load_state(const TrainingState& state);
  // The same from a source of full tensor states: `source(name)` is the
  // state of tensor `name`, or null when the state lacks it, valid until
  // the next call (a resume reads each from the checkpoint as it is asked
  // for, holding a parameter's tensors at a time, not the rank's state:
  // the tensors come in the order of this rank's shards, a parameter's
  // one after another, and a tensor may be asked for once per shard
  // holding it). `step` is the state's.
  using StateSource = std::function<const TensorState*(const std::string& name)>;
  LoadCounts load_state(const StateSource& source, int64_t step);


  // Full shape of every parameter tensor of the model ("M/k.r/<tensor>").
  // Pure: the same on every rank.
  const std::map<std::string, Shape>& param_shapes() const;

  int64_t steps_done() const { return step_; }
  // The plan as this executor lowered it (every rank's program; this rank
  // runs programs[rank]).
  const plan::Lowered& lowered() const;
  // Buckets of this rank and the communicators made for their started
  // all-reduces (Comm::duplicate; 0 for communicators that give none).
  int buckets() const {
    return static_cast<int>(std::count_if(bucket_comm_.begin(), bucket_comm_.end(), [](const Comm* c) { return c; }));
  }
  int bucket_communicators() const { return static_cast<int>(bucket_dups_.size()); }

 private:
  using Clock = std::chrono::steady_clock;
  struct ParamState;

  // One instruction kind of the lowered program each.
  void forward_exchange(const plan::Instr& instr);
  void post_transfers(const plan::Instr& instr);   // post_send, post_recv
  // Transfers: the rows of a transfer on this rank, as a view of the
  // tensor that holds them (a local transfer's piece: tensors are not
  // written after they are made, tensor.h) and as a copy to send; posting
  // one send or receive; the exchange's pieces that end on this rank
  // (transfer, piece) in program order; waiting for the sends posted early.
  Tensor transfer_rows(const plan::Transfer& t) const;
  Shape incoming_shape(const plan::Transfer& t) const;   // of what a receive of `t` gets
  // Copies (Direction::copy): fn(tensor, first value there, first value in
  // the transfer, count) for each whole tensor of the shards at `tp_rank` of
  // t's parameters that t's values cover; t's values of TP rank 0's shards,
  // packed (what a copy sends); and the copy exchange, which writes what
  // it gets into the shards of TP ranks above 0.
  template <class Fn>
  void for_each_copy_piece(const plan::Transfer& t, int tp_rank, Fn fn) const;
  Tensor copy_values(const plan::Transfer& t) const;
  void copy_exchange(const plan::Instr& instr);
  Tensor outgoing(const plan::Transfer& t);
  void post_send(int transfer);
  void post_recv(int transfer);
  std::vector<std::pair<int, Tensor>> complete_exchange(const plan::Instr& instr);
  void finish_sends();
  Tensor read_rows(const plan::Operator& op, int64_t row_begin, int64_t row_end);  // from data_ (host)
  double lm_share(int slice, const plan::Operator& op, const Tensor& targets);
  void forward_slice(int slice);
  void backward_slice(int slice);
  void backward_exchange(const plan::Instr& instr);
  void start_bucket(int bucket);
  void finish_bucket(int bucket);
  void progress_collectives();   // started all-reduces and all-gathers
  void optimizer_step(int bucket);   // Instr::bucket: a bucket's shards, -1: the rest
  void norm_sum(const plan::Instr& in);   // norm_sum: this rank's sum of squares
  void gradient_norm();              // grad_norm: the global norm and the clipping factor
  void gather_bucket(int bucket);    // allgather: the bucket's stepped values from every member
  void start_gather(int bucket);     // allgather_start: the same, started
  void finish_gather(int bucket);    // allgather_wait: and waited for
  // With overlap and sharded state the step ends with each rank holding
  // only its own chunk of each bucket stepped, until the next step's
  // gathers (values_partial_): the blocking all-gather of every bucket of
  // this rank, buckets in the lowering's order, makes the values whole
  // first (before an evaluation, gather_state, gather_params). Collective
  // over each bucket's group; nothing when the values are whole.
  void gather_values();
  // fn(key, ParamState&, i, off) for tensor i of every shard (`key`) of
  // gradient bucket `bucket`, in its flat layout (shards in key order, each shard's tensors
  // in order: the all-reduce's), `off` its first value there. Throws
  // std::logic_error when the tensors do not add up to the lowering's
  // Bucket::values (the two would lay the bucket out differently).
  template <class Fn>
  void for_each_tensor(int bucket, Fn fn);
  bool in_bucket(size_t bucket) const;   // this rank is one of the lowering's bucket's devices
  // What gather_chunks gathers: parameter values, gradients, or a moment.
  enum class Part { value, grad, m, v };
  // This rank's chunk of bucket `bucket`'s `part` (ParamState::own), copied
  // into a new buffer (device memory when `device`), as its all-gather
  // sends it.
  Tensor own_chunk(int bucket, Part part, bool device);
  // A buffer of `values` floats for a bucket's collectives: in device
  // memory when `device` (NCCL), else zeroed host memory.
  Tensor flat_buffer(int64_t values, bool device);
  // Copies `all` (a bucket's flat buffer) into the values of its tensors.
  void set_values(int bucket, const Tensor& all);
  // Bucket `bucket`'s `part` as each member holds its own chunk of it
  // (ParamState::own: ZeRO-1), all-gathered over the bucket's communicator
  // into one buffer of Lowered::flat_values floats in the bucket's flat
  // layout, in device memory when `device` (NCCL), else in host memory.
  Tensor gather_chunks(int bucket, Part part, bool device);
  // With sharded state: every bucket's summed gradients gathered from the
  // chunks its members hold (after a reduce-scatter each holds only its
  // own) into every gradient, for gather_grads. Collective over each
  // bucket's group, buckets in the lowering's order.
  void gather_summed_grads();
  // Allocates every shard's AdamW moments: whole, or with sharded state
  // (ZeRO-1) for the values of its tensors in this rank's chunk of its
  // bucket alone (ParamState::own).
  void allocate_moments();
  // With sharded state: every bucket's moments gathered from its members,
  // as host tensors by shard (the tensors' m, then v), for gather_state.
  // Collective over each bucket's group, buckets in the lowering's order.
  std::map<std::pair<std::string, int>, std::vector<Tensor>> gather_moments();
  void zero_grads();
  bool grads_in_buckets() const;
  void bind_bucket_views();
  // The tensors of parameter `param`'s shard on a TP rank: names, axes and
  // shapes, no values (nothing allocated: a save or a dump receives each
  // shard of a large model into buffers of its own).
  struct ShardTensor {
    std::string name;   // "M/k.r/<tensor>"
    Shape full_shape, shape;
    int shard_axis = -1;
  };
  std::vector<ShardTensor> shard_tensors(const std::string& param) const;
  // One measured box as the step records it (ExecOptions::record_trace):
  // what ran, by the lowering's index (`index`: the wave of post_sends and
  // exchange, the lowered slice of slice, the bucket of gradient_sync,
  // param_gather and optimizer, -1 for the whole optimizer step) and its
  // size (`amount`: bytes posted, floats summed or gathered, rows run).
  // trace() builds names and args from it after the run: recording costs
  // a clock read and a push_back, so the trace perturbs the step it
  // measures (above all an all-reduce in flight) as little as it can.
  enum class BoxKind : uint8_t {
    post_sends, wait_sends, exchange, slice, gradient_sync, param_gather, optimizer, norm_sum, gradient_norm
  };
  struct Box {
    BoxKind kind;
    int index = -1;
    int64_t amount = 0;
    plan::Direction dir = plan::Direction::forward;   // post_sends, exchange, slice
  };
  struct Recorded : Box {
    Clock::time_point t0, t1;
    int64_t step = 0;
    bool eval = false;
    explicit Recorded(const Box& b) : Box(b) {}
  };
  // Keeps `box`, from t0 to now, when the trace is recorded.
  void record(const Box& box, Clock::time_point t0);
  double wall_us(Clock::time_point t) const;

  const plan::Model& model_;
  Comm& world_;
  GroupComms groups_;
  Backend& backend_;
  ExecOptions options_;
  int rank_ = 0;
  std::unique_ptr<Schedule> sched_;

  std::map<std::pair<std::string, int>, ParamState> params_;  // (param "M/k.r", TP rank)
  std::map<int, Op> ops_;                                      // graph operator -> its Op here
  // Per step (empty between steps: each is cleared at the step's end, and
  // an evaluation clears what it uses):
  std::map<int, Tensor> out_;     // operator -> output, this device's rows
  std::map<int, Tensor> dout_;    // operator -> gradient of its output, this device's rows
  std::map<std::pair<int, int>, std::vector<Tensor>> pieces_;  // (slice, input) -> received rows
  std::map<std::pair<int, int>, Tensor> din_;  // (slice, input) -> input gradient, this group's rows
  std::vector<double> loss_;      // per task: this rank's share of the full-batch loss
  StepCounters counters_;
  double norm_squares_ = 0;           // this step's sum of squares on this rank (norm_sum)
  std::optional<double> grad_norm_;   // this step's (gradient_norm)
  std::map<int, double> lm_share_;  // lm_loss operator -> share of the task's loss its rows carry
  // Messages posted and not yet waited for, by transfer: the request and
  // the host buffer it reads (a send) or fills (a receive).
  struct Posted {
    int request = -1;
    Tensor host;
  };
  std::map<int, Posted> posted_sends_, posted_recvs_;
  // Kept across steps: per gradient bucket, its flat all-reduce buffer
  // (where the all-reduce runs in the backend's memory, also the storage of
  // its gradients: bind_bucket_views).
  std::map<int, Tensor> bucket_buffers_;
  // The gradient buckets started and not yet finished (finish_bucket erases).
  struct StartedBucket {
    Comm* comm = nullptr;
    int request = -1;               // Comm::start_all_reduce_sum's (device: start_all_reduce_sum_device's)
    bool device = false;            // the flat buffer is in device memory (NCCL)
    std::vector<Tensor*> grads;     // its flat buffer is bucket_buffers_[bucket]
    bool in_place = true;           // the grads are views of it (nothing to copy back)
    Clock::time_point start;
  };
  std::map<int, StartedBucket> started_;
  // The values' all-gathers started (allgather_start), by bucket: the
  // request, this rank's chunk sent and the whole buffer received.
  struct StartedGather {
    Comm* comm = nullptr;
    int request = -1;
    bool device = false;
    Tensor send, all;
    Clock::time_point start;
  };
  std::map<int, StartedGather> gathers_;
  bool values_partial_ = false;   // gather_values
  // By bucket (of the lowering; nullptr where this rank is not in it): the
  // communicator its all-reduce is started on. Comm::duplicate of the
  // group's, one per group when the plan starts buckets in order, one per
  // bucket when it starts them when ready (a rank may start two buckets
  // of one group in another order than its peers, which one communicator
  // would not allow); the group's own where duplicate gives none (the
  // fakes). bucket_dups_ owns the duplicates.
  std::vector<Comm*> bucket_comm_;
  mutable std::optional<std::map<std::string, Shape>> param_shapes_;   // param_shapes(), once made
  std::vector<std::unique_ptr<Comm>> bucket_dups_;

  // Data: the source the current pass reads, and its batch.
  std::unique_ptr<DataSource> synthetic_;  // the default training data
  DataSource* data_ = nullptr;
  int64_t data_batch_ = 0;
  EvalStats* eval_ = nullptr;  // non-null inside evaluate()

  int64_t step_ = 0;
  Clock::time_point origin_;
  std::vector<Recorded> boxes_;   // record()'s, in order
};

}  // namespace spindle::exec
