#include "libexec/exec/executor.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <set>
#include <stdexcept>

#include "libexec/exec/eval.h"
#include "libplan/rules/devices.h"
#include "libplan/rules/rows.h"
#include "libplan/graph/op_graph.h"
#include "libplan/model/ops.h"

namespace spindle::exec {

using plan::RowLayout;
using plan::RowMove;
using plan::RowRange;
using plan::reshard_moves;

namespace {

// Tags of point-to-point messages on world: a transfer's is its index in
// the lowering (Lowered::transfers; every rank numbers them alike, and
// transfers in flight at once between two ranks never share one); one for
// gathering parameters, which never runs inside a step.
int transfer_tag(int transfer) { return transfer; }
constexpr int kDumpTag = 30000;
constexpr int64_t kBytesPerFloat = 4;  // every buffer crossing a Comm is fp32

// Shape of one batch row of an operator's output: [seq, width] for
// activations ([1, out] after pool_project).
Shape out_row_shape(const plan::Operator& op) {
  const plan::Workload& w = op.workload;
  return {plan::op_out_seq(w.op, w.seq), plan::op_out_width(w.op, w.dims)};
}

Shape with_rows(int64_t rows, const Shape& row_shape) {
  Shape s{rows};
  s.insert(s.end(), row_shape.begin(), row_shape.end());
  return s;
}

// Rows [row0, row0 + rows) of `t` along dimension 0 as a tensor sharing its
// storage (no copy, any device). Only for reading.
Tensor row_view(const Tensor& t, int64_t row0, int64_t rows) {
  Shape shape = t.shape();
  const int64_t row_elems = shape[0] > 0 ? t.numel() / shape[0] : 0;
  shape[0] = rows;
  const float* first = t.data() + row0 * row_elems;
  // Aliasing shared_ptr: keeps t's storage alive, points into it.
  std::shared_ptr<float[]> storage(std::make_shared<Tensor>(t), const_cast<float*>(first));
  return Tensor::wrap(std::move(shape), t.device(), std::move(storage));
}

// Values [begin, begin + n) of `t` in its flat (row-major) order as a 1-D
// tensor sharing its storage (no copy, any device).
Tensor flat_view(const Tensor& t, int64_t begin, int64_t n) { return row_view(t.reshaped({t.numel()}), begin, n); }

// Memory moves through the backend: every tensor below lives in the
// backend's memory (host memory for the CPU backend, where these are plain
// copies), except where a name says host.

// `t` in the backend's memory: itself when it is there already, else a copy.
Tensor to_backend(Backend& be, const Tensor& t) {
  if (t.device() == be.device()) return t;
  Tensor out = be.allocate(t.shape());
  be.copy(t, out);
  return out;
}

// `t` in host memory: itself when it is there already, else a copy.
Tensor to_host(Backend& be, const Tensor& t) {
  if (t.device() == Device::host) return t;
  Tensor out = Tensor::zeros(t.shape());
  be.copy(t, out);
  be.synchronize();
  return out;
}

// Rows [row0, row0 + rows) of `t` along dimension 0, copied.
Tensor copy_rows(Backend& be, const Tensor& t, int64_t row0, int64_t rows) {
  Shape shape = t.shape();
  shape[0] = rows;
  Tensor out = be.allocate(std::move(shape));
  be.copy(row_view(t, row0, rows), out);
  return out;
}

// Concatenation along dimension 0 (all other dimensions equal), copied.
Tensor concat_rows(Backend& be, const std::vector<Tensor>& parts) {
  if (parts.size() == 1) return parts[0];
  Shape shape = parts[0].shape();
  shape[0] = 0;
  for (const Tensor& p : parts) {
    Shape a = p.shape();
    a[0] = 0;
    if (a != shape) throw std::invalid_argument("concat_rows: shapes differ beyond dimension 0");
  }
  for (const Tensor& p : parts) shape[0] += p.size(0);
  Tensor out = be.allocate(shape);
  int64_t row = 0;
  for (const Tensor& p : parts) {
    Tensor dst = row_view(out, row, p.size(0));
    be.copy(p, dst);
    row += p.size(0);
  }
  return out;
}

// [b, s_k, h] parts -> [b, sum s_k, h] (sequence concatenation), and back.
// One copy per batch row and part.
Tensor concat_seq(Backend& be, const std::vector<Tensor>& parts) {
  const int64_t b = parts[0].size(0), h = parts[0].size(2);
  int64_t seq = 0;
  for (const Tensor& p : parts) {
    if (p.size(0) != b || p.size(2) != h)
      throw std::invalid_argument("inputs of different batch or width: " + shape_str(p.shape()));
    seq += p.size(1);
  }
  Tensor out = be.allocate({b, seq, h});
  const Tensor flat_out = out.reshaped({b * seq, h});
  for (int64_t r = 0; r < b; ++r) {
    int64_t off = r * seq;
    for (const Tensor& p : parts) {
      Tensor dst = row_view(flat_out, off, p.size(1));
      be.copy(row_view(p.reshaped({b * p.size(1), h}), r * p.size(1), p.size(1)), dst);
      off += p.size(1);
    }
  }
  return out;
}

std::vector<Tensor> split_seq(Backend& be, const Tensor& t, const std::vector<int64_t>& seqs) {
  const int64_t b = t.size(0), seq = t.size(1), h = t.size(2);
  const Tensor flat = t.reshaped({b * seq, h});
  std::vector<Tensor> out;
  int64_t off = 0;
  for (int64_t s : seqs) {
    Tensor p = be.allocate({b, s, h});
    const Tensor flat_p = p.reshaped({b * s, h});
    for (int64_t r = 0; r < b; ++r) {
      Tensor dst = row_view(flat_p, r * s, s);
      be.copy(row_view(flat, r * seq + off, s), dst);
    }
    out.push_back(std::move(p));
    off += s;
  }
  return out;
}

// True when buffers in the backend's memory can go to `comm` as they are: a
// device backend and a communicator that carries device memory (NCCL).
bool on_device(const Backend& be, const Comm& comm) {
  return be.device() != Device::host && comm.device_memory();
}

// The tensors `grads` (backend memory) as one flat buffer, to be summed
// over a communicator in place: in device memory when the backend's memory
// is a device's and the communicator carries device memory (NCCL), else
// staged through host memory (MPI and the fakes carry host buffers).
// `flat` is the caller's buffer of `floats` floats (at least the
// gradients'; the rest is padding, zero, for a reduce-scatter's equal
// blocks), kept from step to step (allocated here when it has the wrong
// size): no allocation, page faults or zeroing per step.
// Gradients that are views of `flat` in order (bind_bucket_views) are
// reduced where they are: returns true then.
bool pack_flat(Backend& be, bool device, const std::vector<Tensor*>& grads, int64_t floats, Tensor& flat) {
  // Made once per bucket: its path (host or device memory, its
  // communicator's) is fixed for the run. (Checking the tensor's device
  // flag instead made a new buffer every step beside the old one under
  // SPINDLE_TEST_EMULATE_DEVICE, whose backend allocates host tensors.)
  if (flat.numel() != floats) flat = device ? be.allocate({floats}) : Tensor::zeros({floats});
  bool in_place = true;
  int64_t off = 0;
  for (const Tensor* g : grads) {
    in_place = in_place && g->data() == flat.data() + off;
    off += g->numel();
  }
  if (!in_place) {
    off = 0;
    for (const Tensor* g : grads) {
      Tensor dst = row_view(flat, off, g->numel());
      be.copy(*g, dst);
      off += g->numel();
    }
  }
  if (flat.device() == Device::host) be.synchronize();
  return in_place;
}

// Copies the summed `flat` back into `grads` (nothing when in place).
void unpack_flat(Backend& be, bool in_place, const Tensor& flat, const std::vector<Tensor*>& grads) {
  if (in_place) return;
  int64_t off = 0;
  for (Tensor* g : grads) {
    be.copy(row_view(flat, off, g->numel()), *g);
    off += g->numel();
  }
}

// One rank's sends and receives of one exchange in device memory (NCCL),
// posted together by exchange_on_device().
struct DeviceExchange {
  struct Send {
    Tensor data;
    int peer;
  };
  struct Recv {
    Shape shape;
    int peer;
  };
  std::vector<Send> sends;
  std::vector<Recv> recvs;
};

// Runs `ex` over `comm` (a communicator of device memory: every send and
// receive at once, one NCCL group) and returns the received tensors, in the
// backend's memory, in ex.recvs order.
std::vector<Tensor> exchange_on_device(Backend& be, Comm& comm, const DeviceExchange& ex) {
  std::vector<Tensor> got;
  std::vector<Comm::DeviceTransfer> sends, recvs;
  for (const DeviceExchange::Send& s : ex.sends)
    sends.push_back({const_cast<float*>(s.data.data()), s.data.numel(), s.peer});
  for (const DeviceExchange::Recv& r : ex.recvs) {
    got.push_back(be.allocate(r.shape));
    recvs.push_back({got.back().data(), got.back().numel(), r.peer});
  }
  comm.exchange_device(sends, recvs);
  return got;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Every rank's `x` (backend memory) stacked along dimension 0 in rank order,
// in the backend's memory: NCCL's all-gather on device memory with a CUDA
// backend and an NCCL comm, else the host all-gather, staged.
Tensor all_gather_rows(Backend& be, Comm& comm, const Tensor& x) {
  Shape shape = x.shape();
  shape[0] *= comm.size();
  if (on_device(be, comm)) {
    Tensor out = be.allocate(shape);
    comm.all_gather_device(x.data(), out.data(), x.numel());
    return out;
  }
  const Tensor staged = to_host(be, x);
  Tensor out = Tensor::zeros(shape);
  comm.all_gather({staged.data(), static_cast<size_t>(staged.numel())}, {out.data(), static_cast<size_t>(out.numel())});
  return to_backend(be, out);
}

// Calls f(i, j) for every element i of block t of k along `axis` of a
// tensor of shape `fs` (axis < 0: the whole tensor), j its offset there.
template <class F>
void each_shard_element(const Shape& fs, int64_t local_numel, int axis, int t, int k, F f) {
  if (axis < 0) {
    for (int64_t i = 0; i < local_numel; ++i) f(i, i);
    return;
  }
  const auto a = static_cast<size_t>(axis);
  int64_t inner = 1;
  for (size_t d = a + 1; d < fs.size(); ++d) inner *= fs[d];
  const int64_t full_a = fs[a], local_a = full_a / k;
  for (int64_t i = 0; i < local_numel; ++i) {
    const int64_t o = i / (local_a * inner), rem = i % (local_a * inner);
    f(i, (o * full_a + t * local_a + rem / inner) * inner + rem % inner);
  }
}

// Writes `local` (block t of k along `axis`) into `full`.
void place_shard(Tensor& full, const Tensor& local, int axis, int t, int k) {
  each_shard_element(full.shape(), local.numel(), axis, t, k, [&](int64_t i, int64_t j) { full[j] = local[i]; });
}

// Copies block t of k along `axis` of `full` into `local` (the inverse of
// place_shard).
void take_shard(Tensor& local, const Tensor& full, int axis, int t, int k) {
  each_shard_element(full.shape(), local.numel(), axis, t, k, [&](int64_t i, int64_t j) { local[i] = full[j]; });
}

}  // namespace

// ---------------------------------------------------------------------------
// The lowered programs (libplan/lower): what every rank runs, derived
// identically on every rank from (model, plan).

namespace {
// The lowering this rank runs: as asked, except that over device memory
// (NCCL) sends stay in their exchanges (no early transfers: NCCL's
// point-to-point calls do not run on a stream of their own yet, so a send
// posted early would hold the compute stream until its receiver came).
plan::GradSync runtime_sync(plan::GradSync sync, const Backend& backend, const Comm& world) {
  if (on_device(backend, world)) sync.early_transfers = false;
  return sync;
}

plan::Lowered lower_or_throw(const plan::Model& model, const plan::Plan& plan, const plan::GradSync& sync,
                             bool copies) {
  const plan::OpGraph graph = plan::expand(model);
  plan::LowerOptions options;
  options.sync = sync;
  options.copies = copies;
  auto lowered = plan::lower(plan, model, graph, options);
  if (!lowered.ok()) throw std::invalid_argument(lowered.error().message);
  return std::move(lowered).value();
}
}  // namespace

struct Schedule {
  plan::OpGraph graph;
  plan::Lowered lowered;

  Schedule(const plan::Model& model, const plan::Plan& plan, const plan::GradSync& sync = {}, bool copies = true)
      : graph(plan::expand(model)), lowered(lower_or_throw(model, plan, sync, copies)) {}
  const plan::LoweredSlice& slice(int s) const { return lowered.slices[static_cast<size_t>(s)]; }
  int position(int s, int device) const { return lowered.position(s, device); }
};

std::vector<std::vector<int>> Executor::device_groups(const plan::Model& model, const plan::Plan& plan) {
  const Schedule s(model, plan);
  std::set<std::vector<int>> out;
  for (const plan::LoweredSlice& si : s.lowered.slices) {
    out.insert(si.devices);
    const int k = si.layout.tp;
    for (int g = 0; k > 1 && g < si.layout.groups(); ++g)
      out.insert(std::vector<int>(si.devices.begin() + g * k, si.devices.begin() + (g + 1) * k));
  }
  for (const plan::Bucket& b : s.lowered.buckets) out.insert(b.devices);
  return {out.begin(), out.end()};
}

// ---------------------------------------------------------------------------

struct Executor::ParamState {
  ParamSet set;
  // By tensor of set: the values whose AdamW moments this rank holds and
  // which it steps: all of them ([0, numel)), or with sharded state
  // (ZeRO-1) those in this rank's chunk of the shard's bucket (possibly
  // none). allocate_moments sets them.
  std::vector<plan::ValueRange> own;
  std::vector<Tensor> m, v;  // AdamW moments of `own`, one 1-D tensor per tensor of set (empty: owns none)
  int64_t adam_steps = 0;    // AdamW steps taken (bias correction); step_ unless resumed as new
  std::vector<int> sync;     // devices holding this shard (ascending)
  int64_t stepped = 0;       // the training step of its last optimizer step
};

Executor::Executor(const plan::Model& model, const plan::Plan& plan, Comm& world, GroupComms groups,
                   Backend& backend, ExecOptions options)
    : model_(model), world_(world), groups_(std::move(groups)), backend_(backend),
      options_(options), rank_(world.rank()),
      sched_(std::make_unique<Schedule>(model, plan, runtime_sync(options.sync, backend, world), options.tp_copies)),
      loss_(model.tasks.size(), 0.0),
      synthetic_(std::make_unique<SyntheticSource>(options.seed, 0, options.host_threads)),
      data_(synthetic_.get()), origin_(Clock::now()) {
  if (!(options.clip_grad >= 0) || std::isinf(options.clip_grad))
    throw std::invalid_argument("clip_grad must be a finite number >= 0");
  if (options.clip_grad > 0 && !options.sync.grad_norm)
    throw std::invalid_argument("clipping gradients needs programs that compute their norm (GradSync::grad_norm)");
  if (world.size() != plan.devices)
    throw std::invalid_argument("the plan is for " + std::to_string(plan.devices) +
                                " devices but the world has " + std::to_string(world.size()) + " ranks");
  if (!sched_->lowered.transfers.empty() &&
      transfer_tag(static_cast<int>(sched_->lowered.transfers.size()) - 1) > world.max_tag())
    throw std::invalid_argument("the plan has " + std::to_string(sched_->lowered.transfers.size()) +
                                " transfers, more than this communicator has message tags (" +
                                std::to_string(world.max_tag()) + ")");
  auto comm_of = [&](const std::vector<int>& devs) -> Comm* {
    const auto it = groups_.find(devs);
    if (it == groups_.end())
      throw std::invalid_argument("no communicator for a device group of rank " + std::to_string(rank_));
    return it->second.get();
  };
  // Ops (and the parameter shards they use) of every slice on this device.
  for (size_t si = 0; si < sched_->lowered.slices.size(); ++si) {
    const plan::LoweredSlice& s = sched_->slice(static_cast<int>(si));
    const int pos = sched_->position(static_cast<int>(si), rank_);
    if (pos < 0) continue;
    const int k = s.layout.tp, g = s.layout.group_of(pos), t = s.layout.tp_rank_of(pos);
    Comm* tp = k > 1 ? comm_of(std::vector<int>(s.devices.begin() + g * k, s.devices.begin() + (g + 1) * k))
                     : nullptr;
    for (int o : s.ops) {
      const plan::Operator& op = sched_->graph.ops[static_cast<size_t>(o)];
      const plan::Task& task = model.tasks[static_cast<size_t>(op.task)];
      const plan::Module* module = model.find_module(task.nodes[static_cast<size_t>(op.node)].module);
      OpConfig cfg;
      cfg.kind = op_kind(op.workload.op).value();
      cfg.dims = op.workload.dims;
      cfg.max_seq = module->max_seq;
      cfg.use_tp(tp);
      auto [it, fresh] = params_.try_emplace({op.param, t});
      ParamState& ps = it->second;
      if (fresh) {
        // Seeded on the host, then resident in the backend's memory for the
        // whole run: value and gradient (AdamW moments: allocate_moments).
        ps.set = make_params(cfg, op.param, options_.seed, options_.host_threads);
        for (Param& p : ps.set.params) {
          p.value = to_backend(backend_, p.value);
          p.grad = backend_.allocate(p.value.shape());
        }
        const auto devs = sched_->lowered.shard_devices.find({op.param, t});
        if (devs != sched_->lowered.shard_devices.end()) ps.sync = devs->second;
        else ps.sync = {rank_};  // no parameters (contrastive_loss)
      }
      ops_.emplace(o, make_op(cfg, ps.set));
    }
  }
  allocate_moments();
  bind_bucket_views();
  // Started all-reduces get communicators of their own, so that they never
  // match the blocking collectives a slice over the same group runs during
  // the backward pass. Made in one order (the lowering's bucket order) on
  // every rank, each by every member of its group.
  const std::vector<plan::Bucket>& buckets = sched_->lowered.buckets;
  const bool per_bucket = plan.bucket_starts == plan::BucketStarts::when_ready;
  std::map<std::vector<int>, Comm*> of_group;   // per_bucket false: the group's one duplicate
  bucket_comm_.assign(buckets.size(), nullptr);
  for (size_t b = 0; b < buckets.size(); ++b) {
    const std::vector<int>& devs = buckets[b].devices;
    if (!std::binary_search(devs.begin(), devs.end(), rank_)) continue;
    Comm& group = *groups_.at(devs);
    if (const auto made = of_group.find(devs); made != of_group.end()) {
      bucket_comm_[b] = made->second;
      continue;
    }
    std::unique_ptr<Comm> dup = group.duplicate();
    bucket_comm_[b] = dup ? dup.get() : &group;
    if (dup) bucket_dups_.push_back(std::move(dup));
    if (!per_bucket) of_group.emplace(devs, bucket_comm_[b]);
  }
}

bool Executor::in_bucket(size_t bucket) const {
  const std::vector<int>& devices = sched_->lowered.buckets[bucket].devices;
  return std::binary_search(devices.begin(), devices.end(), rank_);
}

template <class Fn>
void Executor::for_each_tensor(int bucket, Fn fn) {
  const plan::Bucket& b = sched_->lowered.buckets[static_cast<size_t>(bucket)];
  int64_t off = 0;
  for (const plan::ShardKey& key : b.shards) {
    ParamState& ps = params_.at(key);
    for (size_t i = 0; i < ps.set.params.size(); ++i) {
      const int64_t n = ps.set.params[i].value.numel();
      fn(key, ps, i, off);
      off += n;
    }
  }
  if (off != b.values)
    throw std::logic_error("bucket " + std::to_string(bucket) + " holds " + std::to_string(off) +
                           " values here, the lowering counts " + std::to_string(b.values));
}

// Where a bucket's all-reduce runs on its flat buffer in the backend's own
// memory (host memory on the CPU backend; device memory on a device
// backend whose communicator carries it, NCCL), the gradients of each
// bucket this rank is in live in that buffer, in the bucket's order
// (shards in key order, each shard's tensors in order): backward adds into
// it and the all-reduce runs on it in place, without copying the gradients
// in and out and without a second copy of them (as PyTorch DDP's
// gradient_as_bucket_view). A device backend over MPI stages the sums in
// host memory: its gradients stay tensors of their own, copied.
bool Executor::grads_in_buckets() const {
  return backend_.device() == Device::host || on_device(backend_, world_);
}

// Binds every gradient of this rank's buckets to its bucket's flat buffer
// (zero-filled, backend memory), once: zero_grads zeroes them there. The
// tensors they were are released first, so a bucket is never held twice.
void Executor::bind_bucket_views() {
  if (!grads_in_buckets()) return;
  const std::vector<plan::Bucket>& buckets = sched_->lowered.buckets;
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (!in_bucket(b)) continue;
    for_each_tensor(static_cast<int>(b), [&](const plan::ShardKey&, ParamState& ps, size_t i, int64_t) {
      ps.set.params[i].grad = {};
    });
    Tensor& flat = bucket_buffers_[static_cast<int>(b)];
    flat = backend_.allocate({sched_->lowered.flat_values(static_cast<int>(b))});
    for_each_tensor(static_cast<int>(b), [&](const plan::ShardKey&, ParamState& ps, size_t i, int64_t off) {
      Param& p = ps.set.params[i];
      p.grad = row_view(flat, off, p.value.numel()).reshaped(p.value.shape());
    });
  }
}

// Every tensor's moments for the values it owns (ParamState::own): with
// sharded state, the member at place i of a bucket's devices owns chunk i
// of the bucket's flat layout (shards in key order, each shard's tensors in
// order: the all-reduce's layout; rules/memory.h owned_values), cut into
// the pieces each tensor has in it; every other shard all of its values.
void Executor::allocate_moments() {
  for (auto& [key, ps] : params_) {
    ps.own.clear();
    for (const Param& p : ps.set.params) ps.own.push_back({0, p.value.numel()});
  }
  const plan::Lowered& l = sched_->lowered;
  for (size_t b = 0; l.sharded_state && b < l.buckets.size(); ++b) {
    if (!in_bucket(b)) continue;
    const plan::ValueRange chunk = l.owned(static_cast<int>(b), rank_);
    for_each_tensor(static_cast<int>(b), [&](const plan::ShardKey&, ParamState& ps, size_t i, int64_t off) {
      const int64_t n = ps.set.params[i].value.numel();
      const int64_t begin = std::clamp<int64_t>(chunk.begin - off, 0, n);
      ps.own[i] = {begin, std::max(begin, std::clamp<int64_t>(chunk.end - off, 0, n))};
    });
  }
  for (auto& [key, ps] : params_) {
    ps.m.clear();
    ps.v.clear();
    for (const plan::ValueRange& r : ps.own) {
      ps.m.push_back(r.size() > 0 ? backend_.allocate({r.size()}) : Tensor());
      ps.v.push_back(r.size() > 0 ? backend_.allocate({r.size()}) : Tensor());
    }
  }
}

Executor::~Executor() = default;

const plan::Lowered& Executor::lowered() const { return sched_->lowered; }

// ---------------------------------------------------------------------------
// The training step.

StepStats Executor::step() {
  const Clock::time_point start = Clock::now();
  ++step_;
  std::fill(loss_.begin(), loss_.end(), 0.0);
  counters_ = StepCounters{};
  backend_.reset_peak_bytes();
  grad_norm_.reset();
  options_.adamw.grad_scale = 1.0f;   // gradient_norm sets the clipping factor
  data_batch_ = step_ - 1;
  zero_grads();

  // This device's lowered program (libplan/lower/lower.h), in order: per
  // wave the exchange that brings its slices' inputs and the forward of its
  // slices; per wave reversed the backward of its slices and the exchange
  // that sends their input gradients back; the all-reduce of each gradient
  // bucket it holds (started during the backward pass, waited for after
  // it), each followed by the optimizer step of its shards; the optimizer
  // step of the shards in no bucket. With the gradient norm (--clip-grad:
  // norm_sum, then grad_norm), every optimizer step follows it, after the
  // last wait.
  // With overlap, each compute's outputs
  // for other ranks are sent right after it (post_send), an exchange's
  // receives are posted one exchange ahead (post_recv), and the step ends
  // waiting for those sends (wait_sends). After each compute
  // the communicators get a poll (MPI moves messages only inside calls).
  const std::vector<plan::Instr>& program = sched_->lowered.programs[static_cast<size_t>(rank_)].instrs;
  std::vector<double> instr_ms(program.size());
  for (size_t pc = 0; pc < program.size(); ++pc) {
    const plan::Instr& in = program[pc];
    const Clock::time_point began = Clock::now();
    switch (in.kind) {
      case plan::InstrKind::exchange:
        if (in.dir == plan::Direction::forward) forward_exchange(in);
        else if (in.dir == plan::Direction::backward) backward_exchange(in);
        else copy_exchange(in);
        break;
      case plan::InstrKind::post_send:
      case plan::InstrKind::post_recv: post_transfers(in); break;
      case plan::InstrKind::wait_sends: finish_sends(); break;
      case plan::InstrKind::forward:
        forward_slice(in.slice);
        world_.progress();
        progress_collectives();
        break;
      case plan::InstrKind::backward:
        backward_slice(in.slice);
        world_.progress();
        progress_collectives();
        break;
      case plan::InstrKind::allreduce:
        start_bucket(in.bucket);
        finish_bucket(in.bucket);
        break;
      case plan::InstrKind::allreduce_start: start_bucket(in.bucket); break;
      case plan::InstrKind::allreduce_wait: finish_bucket(in.bucket); break;
      case plan::InstrKind::optimizer: optimizer_step(in.bucket); break;
      case plan::InstrKind::allgather: gather_bucket(in.bucket); break;
      case plan::InstrKind::allgather_start: start_gather(in.bucket); break;
      case plan::InstrKind::allgather_wait: finish_gather(in.bucket); break;
      case plan::InstrKind::norm_sum: norm_sum(in); break;
      case plan::InstrKind::grad_norm: gradient_norm(); break;
    }
    instr_ms[pc] = ms_since(began);
  }

  if (!posted_sends_.empty() || !posted_recvs_.empty())
    throw std::logic_error("a send or receive posted early was never waited for");
  if (!gathers_.empty()) throw std::logic_error("an all-gather started was never waited for");
  // The step's activations, their gradients and the rows received are not
  // held past it (a checkpoint or an evaluation may follow).
  out_.clear();
  dout_.clear();
  pieces_.clear();
  din_.clear();
  // ZeRO-1 gathered at the next step's start: the values stepped here
  // reach the other members then.
  values_partial_ = sched_->lowered.gathers_at_start;

  // Losses: each rank holds its share of every task's full-batch loss.
  StepStats stats;
  stats.step = step_;
  std::vector<float> loss(loss_.begin(), loss_.end());
  world_.all_reduce_sum(loss);
  stats.task_loss.assign(loss.begin(), loss.end());
  stats.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  // No synchronize: the pool counts an allocation when it is made, in
  // stream order, and a wait here would move the optimizer's tail out of
  // step_ms.
  counters_.peak_bytes = backend_.peak_bytes();
  stats.counters = counters_;
  stats.instr_ms = std::move(instr_ms);
  stats.grad_norm = grad_norm_;
  return stats;
}

// ---------------------------------------------------------------------------
// Phases.

// ---------------------------------------------------------------------------
// Transfers. A transfer's rows leave this rank from a host buffer (MPI, the
// fakes) posted with the transfer's tag, or, over device memory (NCCL), in
// one group per exchange. Sends posted early (post_send) are waited for by
// the program's last instruction (wait_sends); receives posted early
// (post_recv) by the exchange that uses them.

Tensor Executor::transfer_rows(const plan::Transfer& t) const {
  if (t.dir == plan::Direction::copy) return copy_values(t);
  if (t.dir == plan::Direction::forward) {
    const int ps = sched_->lowered.slice_of[static_cast<size_t>(t.producer)];
    const RowRange mine = sched_->slice(ps).layout.rows_of(sched_->position(ps, rank_));
    return row_view(out_.at(t.producer), t.rows.begin - mine.begin, t.rows.size());
  }
  const RowRange mine = sched_->slice(t.slice).layout.rows_of(sched_->position(t.slice, rank_));
  return row_view(din_.at({t.slice, t.input}), t.rows.begin - mine.begin, t.rows.size());
}

Tensor Executor::outgoing(const plan::Transfer& t) {
  const Tensor rows = transfer_rows(t);
  return copy_rows(backend_, rows, 0, rows.size(0));
}

void Executor::post_send(int transfer) {
  const plan::Transfer& t = sched_->lowered.transfers[static_cast<size_t>(transfer)];
  Tensor host = to_host(backend_, outgoing(t));
  const int request =
      world_.post_send({host.data(), static_cast<size_t>(host.numel())}, t.dst, transfer_tag(transfer));
  counters_.sent_bytes += host.numel() * kBytesPerFloat;
  posted_sends_.emplace(transfer, Posted{request, std::move(host)});
}

Shape Executor::incoming_shape(const plan::Transfer& t) const {
  if (t.dir == plan::Direction::copy) return {t.values};
  return with_rows(t.rows.size(), out_row_shape(sched_->graph.ops[static_cast<size_t>(t.producer)]));
}

void Executor::post_recv(int transfer) {
  const plan::Transfer& t = sched_->lowered.transfers[static_cast<size_t>(transfer)];
  Tensor host = Tensor::zeros(incoming_shape(t));
  const int request = world_.post_recv({host.data(), static_cast<size_t>(host.numel())}, t.src, transfer_tag(transfer));
  counters_.received_bytes += host.numel() * kBytesPerFloat;
  posted_recvs_.emplace(transfer, Posted{request, std::move(host)});
}

void Executor::post_transfers(const plan::Instr& instr) {
  const Clock::time_point t0 = Clock::now();
  if (on_device(backend_, world_))
    throw std::logic_error("post_send/post_recv over device memory: lowered with early transfers for NCCL");
  int64_t bytes = 0;
  for (int ti : sched_->lowered.programs[static_cast<size_t>(rank_)].transfers_of(instr)) {
    bytes += sched_->lowered.transfers[static_cast<size_t>(ti)].bytes;
    if (instr.kind == plan::InstrKind::post_send) post_send(ti);
    else post_recv(ti);
  }
  counters_.transfer_ms += ms_since(t0);
  if (instr.kind == plan::InstrKind::post_send)
    record({BoxKind::post_sends, instr.wave, bytes, instr.dir}, t0);
}

void Executor::finish_sends() {
  if (posted_sends_.empty()) return;
  const Clock::time_point t0 = Clock::now();
  for (auto& [transfer, posted] : posted_sends_) world_.wait_p2p(posted.request);
  posted_sends_.clear();
  counters_.transfer_ms += ms_since(t0);
  record({BoxKind::wait_sends}, t0);
}

std::vector<std::pair<int, Tensor>> Executor::complete_exchange(const plan::Instr& instr) {
  std::vector<std::pair<int, Tensor>> got;   // (transfer, piece), transfers ending here in program order
  const std::span<const int> transfers = sched_->lowered.programs[static_cast<size_t>(rank_)].transfers_of(instr);
  if (on_device(backend_, world_)) {
    DeviceExchange ex;
    std::vector<size_t> received;   // indices into got, in ex.recvs order
    for (int ti : transfers) {
      const plan::Transfer& t = sched_->lowered.transfers[static_cast<size_t>(ti)];
      if (t.src == rank_ && t.dst == rank_) {
        got.emplace_back(ti, transfer_rows(t));   // a local copy: no copy
      } else if (t.src == rank_) {
        ex.sends.push_back({outgoing(t), t.dst});
        counters_.sent_bytes += ex.sends.back().data.numel() * kBytesPerFloat;
      } else {
        const Shape shape = incoming_shape(t);
        received.push_back(got.size());
        got.emplace_back(ti, Tensor());
        ex.recvs.push_back({shape, t.src});
        counters_.received_bytes += shape_numel(shape) * kBytesPerFloat;
      }
    }
    std::vector<Tensor> pieces = exchange_on_device(backend_, world_, ex);
    for (size_t i = 0; i < pieces.size(); ++i) got[received[i]].second = std::move(pieces[i]);
    return got;
  }
  // Receives first, then sends (as MPI exchanges post them), each unless
  // posted already; then every receive and this exchange's sends complete.
  for (int ti : transfers) {
    const plan::Transfer& t = sched_->lowered.transfers[static_cast<size_t>(ti)];
    if (t.dst == rank_ && t.src != rank_ && !posted_recvs_.contains(ti)) post_recv(ti);
  }
  std::vector<int> sent_here;
  for (int ti : transfers) {
    const plan::Transfer& t = sched_->lowered.transfers[static_cast<size_t>(ti)];
    if (t.src == rank_ && t.dst != rank_) {
      post_send(ti);
      sent_here.push_back(ti);
    }
  }
  for (int ti : transfers) {
    const plan::Transfer& t = sched_->lowered.transfers[static_cast<size_t>(ti)];
    if (t.dst != rank_) continue;
    if (t.src == rank_) {
      got.emplace_back(ti, transfer_rows(t));   // a local copy: no copy
      continue;
    }
    const auto it = posted_recvs_.find(ti);
    world_.wait_p2p(it->second.request);
    got.emplace_back(ti, to_backend(backend_, it->second.host));
    posted_recvs_.erase(it);
  }
  for (int ti : sent_here) {
    const auto it = posted_sends_.find(ti);
    world_.wait_p2p(it->second.request);
    posted_sends_.erase(it);
  }
  return got;
}

void Executor::forward_exchange(const plan::Instr& instr) {
  const Clock::time_point t0 = Clock::now();
  // Pieces for this rank's slices in program order (local ones copied, the
  // others received), so each input's rows concatenate in order.
  for (auto& [ti, piece] : complete_exchange(instr)) {
    const plan::Transfer& t = sched_->lowered.transfers[static_cast<size_t>(ti)];
    pieces_[{t.slice, t.input}].push_back(std::move(piece));
  }
  counters_.transfer_ms += ms_since(t0);
  record({BoxKind::exchange, instr.wave, 0, plan::Direction::forward}, t0);
}

// ---------------------------------------------------------------------------
// Tensor-parallel copies (Direction::copy): the values of a parameter's
// tensors whole on every TP rank, laid end to end in the order of its
// tensors, move from its TP rank 0 shard into the shards of higher ranks.

template <class Fn>
void Executor::for_each_copy_piece(const plan::Transfer& t, int tp_rank, Fn fn) const {
  plan::for_each_copied_param(sched_->lowered, t, [&](int op, int64_t begin, int64_t end, int64_t at) {
    const std::string& param = sched_->graph.ops[static_cast<size_t>(op)].param;
    int64_t first = 0;   // the tensor's first value among the parameter's whole ones
    for (const Param& p : params_.at({param, tp_rank}).set.params) {
      if (p.shard_axis >= 0) continue;
      const int64_t lo = std::max(begin, first), hi = std::min(end, first + p.value.numel());
      if (lo < hi) fn(p, lo - first, at + (lo - begin), hi - lo);
      first += p.value.numel();
    }
    if (end > first)
      throw std::logic_error(param + ": a copy of values " + std::to_string(begin) + ".." + std::to_string(end) +
                             " of whole tensors that hold " + std::to_string(first));
  });
}

Tensor Executor::copy_values(const plan::Transfer& t) const {
  Tensor out = backend_.allocate({t.values});
  for_each_copy_piece(t, 0, [&](const Param& p, int64_t at, int64_t into, int64_t n) {
    Tensor dst = flat_view(out, into, n);
    backend_.copy(flat_view(p.value, at, n), dst);
  });
  return out;
}

void Executor::copy_exchange(const plan::Instr& instr) {
  const Clock::time_point t0 = Clock::now();
  for (const auto& got : complete_exchange(instr)) {
    const plan::Transfer& t = sched_->lowered.transfers[static_cast<size_t>(got.first)];
    const Tensor& piece = got.second;   // (a structured binding: not capturable by clang 14's lambdas)
    for_each_copy_piece(t, t.slice, [&](const Param& p, int64_t at, int64_t from, int64_t n) {
      Tensor dst = flat_view(p.value, at, n);
      backend_.copy(flat_view(piece, from, n), dst);
    });
  }
  counters_.transfer_ms += ms_since(t0);
  record({BoxKind::exchange, -1, 0, plan::Direction::copy}, t0);
}

void Executor::forward_slice(int slice) {
  const Clock::time_point t0 = Clock::now();
  const plan::LoweredSlice& s = sched_->slice(slice);
  const int pos = sched_->position(slice, rank_);
  const RowRange rows = s.layout.rows_of(pos);
  for (size_t j = 0; j < s.ops.size(); ++j) {
    const int o = s.ops[j];
    const plan::Operator& op = sched_->graph.ops[static_cast<size_t>(o)];
    const plan::Task& task = model_.tasks[static_cast<size_t>(op.task)];
    const std::string& kind = op.workload.op;
    const plan::OpSpec& spec = *plan::find_op(kind);
    std::vector<Tensor> in;
    if (spec.reads_data) {
      in.push_back(to_backend(backend_, read_rows(op, rows.begin, rows.end)));
    } else if (j > 0) {
      in.push_back(out_.at(s.ops[j - 1]));
    } else {
      for (size_t k = 0; k < s.producers.size(); ++k) {
        const auto it = pieces_.find({slice, static_cast<int>(k)});
        if (it == pieces_.end()) throw std::logic_error("a slice's input rows never arrived");
        in.push_back(concat_rows(backend_, it->second));
        pieces_.erase(it);   // read once: the op keeps what it needs
      }
      if (plan::op_needs_whole_batch(kind)) {
        // Gather the whole batch over the slice (blocks of TP rank 0 of each group).
        Comm* comm = groups_.at(s.devices).get();
        for (Tensor& x : in) {
          const Tensor all = all_gather_rows(backend_, *comm, x);
          std::vector<Tensor> blocks;
          for (int g = 0; g < s.layout.groups(); ++g)
            blocks.push_back(row_view(all, g * s.layout.tp * x.size(0), x.size(0)));
          x = concat_rows(backend_, blocks);
        }
      } else if (in.size() > 1) {
        in = {concat_seq(backend_, in)};
      }
    }
    if (kind == "lm_loss") {   // its targets, and this slice's share of the task's token-mean loss
      const Tensor targets = read_rows(op, rows.begin, rows.end);
      lm_share_[o] = lm_share(slice, op, targets);
      in.push_back(to_backend(backend_, targets));
    }
    if (kind == "contrastive_loss" && eval_ && pos == 0) {
      DataRead labels;  // the whole batch's, if the data has them
      labels.task = op.task;
      labels.task_name = task.name;
      labels.kind = DataKind::labels;
      labels.row_end = s.layout.batch;
      const RetrievalHits h = retrieval_hits(to_host(backend_, in[0]), to_host(backend_, in[1]),
                                             data_->read(labels, data_batch_));
      eval_->hits_ab[static_cast<size_t>(op.task)] += static_cast<double>(h.a_to_b);
      eval_->hits_ba[static_cast<size_t>(op.task)] += static_cast<double>(h.b_to_a);
      eval_->queries[static_cast<size_t>(op.task)] += static_cast<double>(h.queries);
    }
    Tensor y = backend_.forward(ops_.at(o), in);
    if (kind == "contrastive_loss") {
      if (pos == 0) loss_[static_cast<size_t>(op.task)] += task.weight * to_host(backend_, y)[0];
    } else if (kind == "lm_loss") {
      if (s.layout.tp_rank_of(pos) == 0)
        loss_[static_cast<size_t>(op.task)] += task.weight * to_host(backend_, y)[0] * lm_share_.at(o);
    }
    out_[o] = std::move(y);
    // The operator before it in the slice had one reader, this one: its
    // output is dropped (the op keeps what its backward needs), so that a
    // step holds each activation once. A slice's last output stays for
    // the transfers and slices that read it.
    if (j > 0) out_.erase(s.ops[j - 1]);
  }
  counters_.compute_ms += ms_since(t0);
  record({BoxKind::slice, slice, static_cast<int64_t>(rows.size()), plan::Direction::forward}, t0);
}

void Executor::backward_slice(int slice) {
  const Clock::time_point t0 = Clock::now();
  const plan::LoweredSlice& s = sched_->slice(slice);
  const int pos = sched_->position(slice, rank_);
  const RowRange rows = s.layout.rows_of(pos);
  for (size_t j = s.ops.size(); j-- > 0;) {
    const int o = s.ops[j];
    const plan::Operator& op = sched_->graph.ops[static_cast<size_t>(o)];
    const std::string& kind = op.workload.op;
    const double weight = model_.tasks[static_cast<size_t>(op.task)].weight;
    Tensor dy;
    if (kind == "contrastive_loss") {
      dy = Tensor::from({1}, {static_cast<float>(weight)});
    } else if (kind == "lm_loss") {
      dy = Tensor::from({1}, {static_cast<float>(weight * lm_share_.at(o))});
    } else {
      const auto it = dout_.find(o);
      if (it == dout_.end()) throw std::logic_error("an operator's output gradient never arrived");
      dy = std::move(it->second);
      dout_.erase(it);   // read once
    }
    std::vector<Tensor> dx = backend_.backward(ops_.at(o), dy);
    if (dx.empty()) continue;  // data readers
    if (j > 0) {
      dout_[s.ops[j - 1]] = std::move(dx[0]);
    } else if (plan::op_needs_whole_batch(kind)) {
      // Full-batch gradients: keep this group's rows.
      for (size_t k = 0; k < dx.size(); ++k)
        din_[{slice, static_cast<int>(k)}] = copy_rows(backend_, dx[k], rows.begin, rows.size());
    } else if (s.producers.size() > 1) {
      std::vector<int64_t> seqs;
      for (int p : s.producers)
        seqs.push_back(out_row_shape(sched_->graph.ops[static_cast<size_t>(p)])[0]);
      std::vector<Tensor> parts = split_seq(backend_, dx[0], seqs);
      for (size_t k = 0; k < parts.size(); ++k) din_[{slice, static_cast<int>(k)}] = std::move(parts[k]);
    } else {
      din_[{slice, 0}] = std::move(dx[0]);
    }
  }
  counters_.compute_ms += ms_since(t0);
  record({BoxKind::slice, slice, static_cast<int64_t>(rows.size()), plan::Direction::backward}, t0);
}

void Executor::backward_exchange(const plan::Instr& instr) {
  const Clock::time_point t0 = Clock::now();
  // Gradient pieces for this rank's producers in program order (local ones
  // copied, the others received), added up in that order (several
  // consumers add into one producer's output gradient).
  for (const auto& [ti, piece] : complete_exchange(instr)) {
    const plan::Transfer& t = sched_->lowered.transfers[static_cast<size_t>(ti)];
    const plan::Operator& p = sched_->graph.ops[static_cast<size_t>(t.producer)];
    const int ps = sched_->lowered.slice_of[static_cast<size_t>(t.producer)];
    const RowRange mine = sched_->slice(ps).layout.rows_of(sched_->position(ps, rank_));
    auto [it, fresh] = dout_.try_emplace(t.producer);
    const Shape whole = with_rows(mine.size(), out_row_shape(p));
    if (!t.adds) {
      // The lowering's rule (Transfer::adds): the first piece, covering all
      // of this rank's rows, is taken as it is (no zero-filled buffer, no
      // add; a later piece adds into it). It may alias a consumer's input
      // gradient, which no other transfer reads: each transfer carries
      // distinct rows of one consumer input.
      if (!fresh || piece.numel() != shape_numel(whole))
        throw std::logic_error("backward exchange: a piece taken as " + p.id + "'s gradient is not its first or whole");
      it->second = piece.reshaped(whole);
      continue;
    }
    if (fresh) it->second = backend_.allocate(whole);
    Tensor dst = row_view(it->second, t.rows.begin - mine.begin, t.rows.size());
    backend_.add(piece, dst);
  }
  counters_.transfer_ms += ms_since(t0);
  record({BoxKind::exchange, instr.wave, 0, plan::Direction::backward}, t0);
}

// Every gradient zeroed where it is (a bucket's views keep their buffer).
void Executor::zero_grads() {
  for (auto& [key, ps] : params_)
    for (Param& p : ps.set.params) backend_.zero(p.grad);
}

// A gradient bucket's all-reduce: started once this device's gradients
// of it are final (allreduce_start, during the backward pass), finished
// before the optimizer (allreduce_wait); a blocking allreduce
// (--no-overlap) is both at once, through the same calls, so the sums are
// bitwise the same either way. Over device memory (NCCL) the reduction runs
// on the bucket communicator's own stream and the finish makes the compute
// stream wait for it, not the host (nccl_comm.h).
void Executor::start_bucket(int bucket) {
  const Clock::time_point t0 = Clock::now();
  Comm& comm = *bucket_comm_.at(static_cast<size_t>(bucket));
  StartedBucket& started = started_[bucket];
  started.comm = &comm;
  started.start = t0;
  started.grads.clear();
  // The bucket's flat layout, the same on every member of the group.
  for_each_tensor(bucket, [&](const plan::ShardKey&, ParamState& ps, size_t i, int64_t) {
    started.grads.push_back(&ps.set.params[i].grad);
  });
  Tensor& flat = bucket_buffers_[bucket];
  started.device = on_device(backend_, comm);
  started.in_place = pack_flat(backend_, started.device, started.grads, sched_->lowered.flat_values(bucket), flat);
  // Views of a buffer in device memory go to a communicator that carries
  // it: bind_bucket_views asked the world's, every bucket's is of its kind.
  if (started.in_place && backend_.device() != Device::host && !started.device)
    throw std::logic_error("bucket " + std::to_string(bucket) +
                           ": its gradients are views of a device buffer, but its communicator carries host memory");
  // Sharded optimizer state (ZeRO-1): each member needs the sum of its own
  // chunk alone (the buffer is padded to equal chunks).
  const bool scatter = sched_->lowered.sharded_state;
  const std::span<float> host{flat.data(), static_cast<size_t>(flat.numel())};
  if (started.device)
    started.request = scatter ? comm.start_reduce_scatter_sum_device(flat.data(), flat.numel())
                              : comm.start_all_reduce_sum_device(flat.data(), flat.numel());
  else
    started.request = scatter ? comm.start_reduce_scatter_sum(host) : comm.start_all_reduce_sum(host);
  counters_.sync_ms += ms_since(t0);
}

void Executor::finish_bucket(int bucket) {
  const Clock::time_point t0 = Clock::now();
  StartedBucket& started = started_.at(bucket);
  Tensor& flat = bucket_buffers_[bucket];
  if (started.device) started.comm->wait_all_reduce_device(started.request);
  else started.comm->wait_all_reduce(started.request);
  unpack_flat(backend_, started.in_place, flat, started.grads);
  counters_.reduced_bytes += flat.numel() * kBytesPerFloat;
  counters_.sync_ms += ms_since(t0);
  // From its start to its end: behind the backward pass when overlapped.
  record({BoxKind::gradient_sync, bucket, flat.numel()}, started.start);
  started_.erase(bucket);
}

// Lets the started all-reduces and all-gathers advance between operators
// (MPI progresses non-blocking collectives only inside MPI calls). Their
// time is in no counter: the simulation runs a started collective beside
// the device's work and prices only the part its wait is blocked on
// (sync_ms), as spindle-profile --measure fits its fixed cost.
void Executor::progress_collectives() {
  for (auto& [bucket, started] : started_) (void)started.comm->progress();
  for (auto& [bucket, gather] : gathers_) (void)gather.comm->progress();
}

// AdamW on the shards of `bucket` (its gradients just summed), or with
// bucket -1 on every shard not stepped yet this step. Each shard's update
// depends on its own gradient and moments alone, so stepping bucket by
// bucket gives bitwise the step of all at once.
void Executor::optimizer_step(int bucket) {
  const Clock::time_point t0 = Clock::now();
  // Every tensor of the shards, in one backend call; with
  // ExecOptions::decay_1d false, the 1-D tensors in a second one without
  // weight decay.
  std::vector<AdamWUpdate> updates, undecayed;
  std::deque<Tensor> views;           // the owned values and gradients they update (stable addresses)
  auto step_shard = [&](ParamState& ps) {
    if (ps.stepped >= step_)   // a lowering bug: every shard is stepped once per step
      throw std::logic_error("optimizer: a parameter shard stepped twice in step " + std::to_string(step_));
    ps.stepped = step_;
    ++ps.adam_steps;   // counted on every holder, whether it owns values of the shard or not
    for (size_t i = 0; i < ps.set.params.size(); ++i) {
      Param& p = ps.set.params[i];
      const plan::ValueRange r = ps.own[i];
      if (r.size() == 0) continue;
      Tensor* value = &views.emplace_back(flat_view(p.value, r.begin, r.size()));
      const Tensor* grad = &views.emplace_back(flat_view(p.grad, r.begin, r.size()));
      const bool decays = options_.decay_1d || p.full_shape.size() != 1;
      (decays ? updates : undecayed).push_back({ps.adam_steps, value, grad, &ps.m[i], &ps.v[i]});
    }
  };
  if (bucket >= 0) {
    for (const plan::ShardKey& key : sched_->lowered.buckets[static_cast<size_t>(bucket)].shards)
      step_shard(params_.at(key));
  } else {
    for (auto& [key, ps] : params_)
      if (ps.stepped < step_) step_shard(ps);
  }
  backend_.adamw_steps(options_.adamw, updates);
  if (!undecayed.empty()) {
    AdamWConfig no_decay = options_.adamw;
    no_decay.weight_decay = 0;
    backend_.adamw_steps(no_decay, undecayed);
  }
  counters_.compute_ms += ms_since(t0);
  record({BoxKind::optimizer, bucket}, t0);
}

// This rank's share of the squared global norm (norm_sum: after every
// all-reduce of its buckets), as one device would compute it over the full
// tensors: the squares of the gradient values it counts, summed in double
// where the gradients are (Backend::sum_squares). A value is counted once:
// of a shard several devices hold, after the all-reduce, the first
// holder's copy, or with sharded state (ZeRO-1, where each member holds the
// sum of its own chunk alone) every member's own values (ParamState::own):
// Lowered::counts_in_norm; and of a tensor replicated over a TP group
// (Param::shard_axis -1) only TP rank 0's copy. Their number is the
// instruction's values (Lowered::norm_values), checked.
void Executor::norm_sum(const plan::Instr& in) {
  const Clock::time_point t0 = Clock::now();
  std::vector<Tensor> counted;   // views of the gradient values this rank counts
  int64_t values = 0;
  for (auto& [key, ps] : params_) {
    if (!sched_->lowered.counts_in_norm(key, rank_)) continue;
    for (size_t i = 0; i < ps.set.params.size(); ++i) {
      const Param& p = ps.set.params[i];
      const plan::ValueRange r = ps.own[i];
      if (!plan::tp_copy_counts(p.shard_axis, key.second) || r.size() == 0) continue;
      counted.push_back(flat_view(p.grad, r.begin, r.size()));
      values += r.size();
    }
  }
  if (values != in.values)
    throw std::logic_error("norm_sum: this rank counts " + std::to_string(values) +
                           " gradient values, the lowering says " + std::to_string(in.values));
  norm_squares_ = backend_.sum_squares(counted);
  counters_.compute_ms += ms_since(t0);
  record({BoxKind::norm_sum, -1, values}, t0);
}

// The global L2 norm of the step's gradients (grad_norm: after norm_sum,
// before this rank's optimizer steps): the world sums every rank's
// norm_sum in fp32 (Megatron sums its norm in fp32 too). With
// ExecOptions::clip_grad > 0, AdamW then scales every gradient by clip /
// (norm + 1e-6) when that is below 1, the factor computed in double and
// rounded to fp32 (grad_scale).
void Executor::gradient_norm() {
  const Clock::time_point t0 = Clock::now();
  std::vector<float> sum{static_cast<float>(norm_squares_)};
  world_.all_reduce_sum(sum);
  const double norm = std::sqrt(static_cast<double>(sum[0]));
  grad_norm_ = norm;
  if (options_.clip_grad > 0) {
    const double factor = options_.clip_grad / (norm + 1e-6);
    if (factor < 1) options_.adamw.grad_scale = static_cast<float>(factor);
  }
  counters_.sync_ms += ms_since(t0);
  record({BoxKind::gradient_norm}, t0);
}

Tensor Executor::flat_buffer(int64_t values, bool device) {
  return device ? backend_.allocate({values}) : Tensor::zeros({values});
}

Tensor Executor::own_chunk(int bucket, Part part, bool device) {
  const plan::Lowered& l = sched_->lowered;
  const auto members = static_cast<int64_t>(l.buckets[static_cast<size_t>(bucket)].devices.size());
  const int64_t chunk = l.flat_values(bucket) / members;
  Tensor send = flat_buffer(chunk, device);
  int64_t at = 0;   // this rank's chunk: the owned values of each tensor, in layout order
  for_each_tensor(bucket, [&](const plan::ShardKey&, ParamState& ps, size_t i, int64_t) {
    const plan::ValueRange r = ps.own[i];
    if (r.size() == 0) return;
    Param& p = ps.set.params[i];
    const Tensor mine = part == Part::value ? flat_view(p.value, r.begin, r.size())
                        : part == Part::grad ? flat_view(p.grad, r.begin, r.size())
                        : part == Part::m    ? ps.m[i]
                                             : ps.v[i];
    Tensor dst = flat_view(send, at, r.size());
    backend_.copy(mine, dst);
    at += r.size();
  });
  if (at != l.owned(bucket, rank_).size())
    throw std::logic_error("all-gather of bucket " + std::to_string(bucket) + ": this rank owns " + std::to_string(at) +
                           " values, the lowering says " + std::to_string(l.owned(bucket, rank_).size()));
  if (!device) backend_.synchronize();   // the copies into `send` are done
  return send;
}

Tensor Executor::gather_chunks(int bucket, Part part, bool device) {
  const Tensor send = own_chunk(bucket, part, device);
  const int64_t chunk = send.numel();
  Tensor all = flat_buffer(sched_->lowered.flat_values(bucket), device);
  Comm& comm = *bucket_comm_.at(static_cast<size_t>(bucket));
  if (device) {
    comm.all_gather_device(send.data(), all.data(), chunk);
  } else {
    comm.all_gather({send.data(), static_cast<size_t>(send.numel())}, {all.data(), static_cast<size_t>(all.numel())});
  }
  return all;
}

// ZeRO-1: bucket `bucket`'s values as every member stepped its own chunk
// of them (optimizer_step), all-gathered and copied into every tensor:
// each member then holds the same values, bitwise, as if it had stepped
// them all. The buffers live for the call only.
void Executor::gather_bucket(int bucket) {
  const Clock::time_point t0 = Clock::now();
  const Tensor all =
      gather_chunks(bucket, Part::value, on_device(backend_, *bucket_comm_.at(static_cast<size_t>(bucket))));
  set_values(bucket, all);
  counters_.sync_ms += ms_since(t0);
  record({BoxKind::param_gather, bucket, all.numel()}, t0);
}

void Executor::set_values(int bucket, const Tensor& all) {
  for_each_tensor(bucket, [&](const plan::ShardKey&, ParamState& ps, size_t i, int64_t off) {
    Param& p = ps.set.params[i];
    backend_.copy(flat_view(all, off, p.value.numel()), p.value);
  });
  counters_.gathered_bytes += all.numel() * kBytesPerFloat;
}

// Overlapped ZeRO-1 (the step's first instructions): bucket `bucket`'s
// values as every member stepped its own chunk of them in the step before
// (optimizer_step), all-gathered while the forward pass runs; the wait,
// before the first forward using one of them, copies them into every
// tensor (gather_bucket's values, bitwise). The buffers live from the start
// to the wait.
void Executor::start_gather(int bucket) {
  const Clock::time_point t0 = Clock::now();
  StartedGather& g = gathers_[bucket];
  g.comm = bucket_comm_.at(static_cast<size_t>(bucket));
  g.start = t0;
  g.device = on_device(backend_, *g.comm);
  g.send = own_chunk(bucket, Part::value, g.device);
  g.all = flat_buffer(sched_->lowered.flat_values(bucket), g.device);
  if (g.device)
    g.request = g.comm->start_all_gather_device(g.send.data(), g.all.data(), g.send.numel());
  else
    g.request = g.comm->start_all_gather({g.send.data(), static_cast<size_t>(g.send.numel())},
                                         {g.all.data(), static_cast<size_t>(g.all.numel())});
  counters_.sync_ms += ms_since(t0);
}

void Executor::finish_gather(int bucket) {
  const Clock::time_point t0 = Clock::now();
  StartedGather& g = gathers_.at(bucket);
  if (g.device) g.comm->wait_all_reduce_device(g.request);
  else g.comm->wait_all_reduce(g.request);
  set_values(bucket, g.all);
  counters_.sync_ms += ms_since(t0);
  record({BoxKind::param_gather, bucket, g.all.numel()}, g.start);
  gathers_.erase(bucket);
}

void Executor::gather_values() {
  if (!values_partial_) return;
  for (size_t b = 0; b < sched_->lowered.buckets.size(); ++b)
    if (in_bucket(b)) gather_bucket(static_cast<int>(b));
  values_partial_ = false;
}

// ---------------------------------------------------------------------------
// Data and evaluation.

void Executor::set_data(DataSource* source) { data_ = source ? source : synthetic_.get(); }

Tensor Executor::read_rows(const plan::Operator& op, int64_t row_begin, int64_t row_end) {
  DataRead r;
  op_data_read(model_, op, &r);
  r.row_begin = row_begin;
  r.row_end = row_end;
  return data_->read(r, data_batch_);
}

// Share of the task's loss that this device's rows of lm_loss `op` carry:
// counted tokens here over counted tokens of the whole batch (design:
// "Runtime semantics"; -1 targets are not counted).
double Executor::lm_share(int slice, const plan::Operator& op, const Tensor& targets) {
  const plan::LoweredSlice& s = sched_->slice(slice);
  const RowRange rows = s.layout.rows_of(sched_->position(slice, rank_));
  if (!data_->may_ignore_targets(op.task))
    return static_cast<double>(rows.size()) / static_cast<double>(s.layout.batch);
  float counted = 0;  // exact below 2^24 tokens
  for (int64_t i = 0; i < targets.numel(); ++i) counted += targets[i] != -1.0f ? 1.0f : 0.0f;
  std::vector<float> total{counted};
  groups_.at(s.devices)->all_reduce_sum(total);  // every TP rank of a group counts its rows once
  total[0] /= static_cast<float>(s.layout.tp);
  return total[0] > 0 ? static_cast<double>(counted) / static_cast<double>(total[0]) : 0.0;
}

std::vector<DataRead> Executor::data_reads(bool labels) const {
  std::vector<DataRead> out;
  for (size_t si = 0; si < sched_->lowered.slices.size(); ++si) {
    const plan::LoweredSlice& s = sched_->slice(static_cast<int>(si));
    const int pos = sched_->position(static_cast<int>(si), rank_);
    if (pos < 0) continue;
    const RowRange rows = s.layout.rows_of(pos);
    for (int o : s.ops) {
      const plan::Operator& op = sched_->graph.ops[static_cast<size_t>(o)];
      DataRead r;
      if (op_data_read(model_, op, &r)) {
        r.row_begin = rows.begin;
        r.row_end = rows.end;
        out.push_back(std::move(r));
      } else if (labels && op.workload.op == "contrastive_loss" && pos == 0) {
        r.task = op.task;
        r.task_name = model_.tasks[static_cast<size_t>(op.task)].name;
        r.kind = DataKind::labels;
        r.row_end = s.layout.batch;
        out.push_back(std::move(r));
      }
    }
  }
  return out;
}

EvalStats Executor::evaluate(DataSource& source, int64_t batch) {
  const size_t tasks = model_.tasks.size();
  EvalStats stats{std::vector<double>(tasks), std::vector<double>(tasks), std::vector<double>(tasks),
                  std::vector<double>(tasks)};
  gather_values();   // the forward pass below has no all-gathers
  DataSource* const training = data_;
  data_ = &source;
  data_batch_ = batch;
  eval_ = &stats;
  out_.clear();
  pieces_.clear();
  std::fill(loss_.begin(), loss_.end(), 0.0);
  // The forward part of this device's program: its forward exchanges and
  // forwards, in program order.
  // With early transfers also the forward post_sends and post_recvs, and
  // the wait for those sends at the end (not the program's wait_sends,
  // which comes after the backward pass).
  for (const plan::Instr& in : sched_->lowered.programs[static_cast<size_t>(rank_)].instrs) {
    const bool forward_comm = in.dir == plan::Direction::forward;
    if (in.kind == plan::InstrKind::exchange && forward_comm) forward_exchange(in);
    else if (in.kind == plan::InstrKind::forward) forward_slice(in.slice);
    else if ((in.kind == plan::InstrKind::post_send || in.kind == plan::InstrKind::post_recv) && forward_comm)
      post_transfers(in);
  }
  finish_sends();
  eval_ = nullptr;
  data_ = training;
  out_.clear();
  pieces_.clear();
  // No backward follows: what the forwards saved for it is dropped now,
  // not held into the next step (whose forwards would replace it one
  // operator at a time, the old beside the new).
  for (auto& [o, op] : ops_) backend_.release_saved(op);
  // One all-reduce: losses, hits both ways, queries.
  std::vector<float> all;
  for (const std::vector<double>* v : {&loss_, &stats.hits_ab, &stats.hits_ba, &stats.queries})
    all.insert(all.end(), v->begin(), v->end());
  world_.all_reduce_sum(all);
  for (size_t t = 0; t < tasks; ++t) {
    stats.task_loss[t] = all[t] / model_.tasks[t].weight;
    stats.hits_ab[t] = all[tasks + t];
    stats.hits_ba[t] = all[2 * tasks + t];
    stats.queries[t] = all[3 * tasks + t];
  }
  return stats;
}

// ---------------------------------------------------------------------------
// Diagnostics.

double Executor::wall_us(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

void Executor::record(const Box& box, Clock::time_point t0) {
  if (!options_.record_trace || step_ < options_.trace_first_step || step_ > options_.trace_last_step) return;
  // A device backend returns before its work is done: wait for it, so that
  // each box holds its own work (tracing serialises host and device).
  backend_.synchronize();
  boxes_.emplace_back(box);
  Recorded& r = boxes_.back();
  r.t0 = t0;
  r.t1 = Clock::now();
  r.step = step_;
  r.eval = eval_;
}

std::vector<plan::TraceEvent> Executor::trace() const {
  std::vector<plan::TraceEvent> events;
  events.reserve(boxes_.size());
  for (const Recorded& r : boxes_) {
    const char* dir = plan::short_name(r.dir);
    plan::TraceEvent e{"", "", rank_, 1, wall_us(r.t0), wall_us(r.t1) - wall_us(r.t0), nlohmann::json::object()};
    switch (r.kind) {
      case BoxKind::post_sends:
        e.name = std::string("post sends ") + dir + " wave " + std::to_string(r.index);
        e.cat = "transfer";
        e.args = {{"bytes", r.amount}, {"wave", r.index}};
        break;
      case BoxKind::wait_sends:
        e.name = "wait for sends";
        e.cat = "transfer";
        break;
      case BoxKind::exchange:
        e.cat = "transfer";
        if (r.dir == plan::Direction::copy) {
          e.name = "transfer copy (TP copies)";
          break;
        }
        e.name = std::string("transfer ") + dir + " wave " + std::to_string(r.index);
        e.args = {{"wave", r.index}};
        break;
      case BoxKind::slice: {
        const plan::LoweredSlice& s = sched_->slice(r.index);
        e.name = std::string(dir) + " " + sched_->graph.ops[static_cast<size_t>(s.ops.front())].id + " x" +
                 std::to_string(s.ops.size());
        e.cat = "compute";
        e.track = 0;
        e.args = {{"metaop", s.metaop}, {"wave", s.wave}, {"rows", r.amount}};
        break;
      }
      case BoxKind::gradient_sync:
      case BoxKind::param_gather:
        e.name = r.kind == BoxKind::gradient_sync ? "gradient sync" : "parameter all-gather";
        e.cat = "sync";
        e.args = {{"floats", r.amount}, {"group", sched_->lowered.buckets[static_cast<size_t>(r.index)].devices}};
        break;
      case BoxKind::gradient_norm:
        e.name = "gradient norm";
        e.cat = "sync";
        break;
      case BoxKind::norm_sum:
        e.name = "optimizer norm sum";   // bench/loop counts "optimizer ..." boxes as the optimizer's
        e.cat = "compute";
        e.track = 0;
        e.args = {{"values", r.amount}};
        break;
      case BoxKind::optimizer:
        e.name = r.index >= 0 ? "optimizer bucket " + std::to_string(r.index) : std::string("optimizer");
        e.cat = "compute";
        e.track = 0;
        break;
    }
    e.args["step"] = r.step;
    if (r.eval) e.args["eval"] = true;  // an evaluation after step r.step
    events.push_back(std::move(e));
  }
  return events;
}

std::vector<Executor::ShardTensor> Executor::shard_tensors(const std::string& param) const {
  const int k = sched_->lowered.param_tp.at(param);
  const plan::Operator& op = sched_->graph.ops[static_cast<size_t>(sched_->lowered.param_op.at(param))];
  const plan::Task& task = model_.tasks[static_cast<size_t>(op.task)];
  const int64_t max_seq = model_.find_module(task.nodes[static_cast<size_t>(op.node)].module)->max_seq;
  std::vector<ShardTensor> out;
  // The op catalogue's tensors, in its order (make_params'), each split
  // along its axis over the k ranks as add_param splits it.
  const std::string kind = op_name(op_kind(op.workload.op).value());
  for (const plan::ParamTensor& t : plan::op_param_tensors(kind, op.workload.dims, max_seq)) {
    ShardTensor st{param + "/" + t.name, t.shape, t.shape, t.shard_axis};
    if (t.shard_axis >= 0) st.shape[static_cast<size_t>(t.shard_axis)] /= k;
    out.push_back(std::move(st));
  }
  return out;
}

const std::map<std::string, Shape>& Executor::param_shapes() const {
  if (!param_shapes_) {
    std::map<std::string, Shape> out;
    for (const auto& [param, o] : sched_->lowered.param_op)
      for (const ShardTensor& t : shard_tensors(param)) out[t.name] = t.full_shape;
    param_shapes_ = std::move(out);
  }
  return *param_shapes_;
}

std::map<std::pair<std::string, int>, std::vector<Tensor>> Executor::gather_moments() {
  std::map<std::pair<std::string, int>, std::vector<Tensor>> out;
  const plan::Lowered& l = sched_->lowered;
  for (size_t b = 0; l.sharded_state && b < l.buckets.size(); ++b) {
    if (!in_bucket(b)) continue;
    for (const Part part : {Part::m, Part::v}) {   // each tensor's m, then each tensor's v
      const Tensor all = gather_chunks(static_cast<int>(b), part, false);
      for_each_tensor(static_cast<int>(b), [&](const plan::ShardKey& key, ParamState& ps, size_t i, int64_t off) {
        const Param& p = ps.set.params[i];
        out[key].push_back(
            Tensor::from(p.value.shape(), std::vector<float>(all.data() + off, all.data() + off + p.value.numel())));
      });
    }
  }
  return out;
}

namespace {
// Adds to `drift` how `copy` (a TP rank > 0's copy of a replicated tensor)
// differs from `first` (TP rank 0's copy, the value kept).
void add_drift(ReplicaDrift& drift, const std::string& name, const Tensor& copy, const Tensor& first) {
  int64_t differ = 0;
  for (int64_t i = 0; i < first.numel(); ++i) {
    if (copy[i] == first[i]) continue;
    ++differ;
    const double rel = std::abs(static_cast<double>(copy[i]) - first[i]) /
                       std::max(std::abs(static_cast<double>(first[i])), 1e-30);
    if (rel > drift.max_relative) {
      drift.max_relative = rel;
      drift.worst = name;
    }
  }
  if (differ == 0) return;
  ++drift.tensors;
  drift.values += differ;
}
}  // namespace

TrainingState Executor::gather_state() {
  TrainingState out;
  out.step = step_;
  // Copies: the sink's tensors may be views of this rank's live state.
  gather_state(
      [&](const std::string& name, int part, const Tensor& full, int64_t adam_steps) {
        TensorState& kept = out.tensors[name];
        kept.part(part) = full.clone();
        kept.adam_steps = adam_steps;
      },
      {0, 0, 0}, &out.drift);
  return out;
}

void Executor::gather_state(const StatePartSink& sink, const std::array<int, 3>& to, ReplicaDrift* drift) {
  gather_values();
  // The parts (0 value, 1 m, 2 v) this rank receives.
  const std::array<bool, 3> mine{to[0] == rank_, to[1] == rank_, to[2] == rank_};
  const bool receives = mine[0] || mine[1] || mine[2];
  // The full tensors of the parameter whose shards are coming in (the
  // map's keys are (param, t): a parameter's shards come one after
  // another), handed to `sink` when the next parameter begins.
  std::map<std::string, TensorState> current;
  std::string current_param;
  auto hand_on = [&] {
    for (auto& [name, ts] : current)
      for (int part = 0; part < 3; ++part)
        if (mine[static_cast<size_t>(part)])
          sink(name, part, ts.part(part), ts.adam_steps);
    current.clear();
  };
  // With sharded state every member of a bucket first gathers its moments.
  const auto gathered = gather_moments();
  // The host moments of shard `key` (held here): its tensors' m, then v,
  // in shard shapes (read only: views where they are on the host already).
  auto moments = [&](const std::pair<std::string, int>& key) {
    if (const auto it = gathered.find(key); it != gathered.end()) return it->second;
    const ParamState& ps = params_.at(key);
    std::vector<Tensor> mv;
    for (const std::vector<Tensor>* of : {&ps.m, &ps.v})
      for (size_t i = 0; i < ps.set.params.size(); ++i)
        mv.push_back(to_host(backend_, (*of)[i]).reshaped(ps.set.params[i].value.shape()));
    return mv;
  };
  for (const auto& [key, devs] : sched_->lowered.shard_devices) {
    const auto& [param, t] = key;
    const int holder = *devs.begin();
    // Per tensor of the shard, each part to the rank that receives it,
    // straight from where it is (no packed copy: a rank sending a large
    // shard holds nothing more), then the AdamW step count (as a float:
    // exact below 2^24 steps) to each rank that received a part. Every
    // pair of ranks sends and receives in the shards' one order.
    std::set<int> receivers;
    for (const int r : to)
      if (r != holder) receivers.insert(r);
    // The holder's host moments of the shard, taken once.
    const std::vector<Tensor> mv = holder == rank_ && (receives || !receivers.empty()) ? moments(key)
                                                                                      : std::vector<Tensor>();
    if (holder == rank_ && !receivers.empty()) {
      const ParamState& ps = params_.at(key);
      const size_t n = ps.set.params.size();
      for (size_t i = 0; i < n; ++i) {
        const Tensor value = to_host(backend_, ps.set.params[i].value);
        const Tensor* parts[3] = {&value, &mv[i], &mv[n + i]};
        for (int part = 0; part < 3; ++part)
          if (to[static_cast<size_t>(part)] != holder)
            world_.send({parts[part]->data(), static_cast<size_t>(parts[part]->numel())}, to[static_cast<size_t>(part)],
                        kDumpTag);
      }
      const float steps = static_cast<float>(ps.adam_steps);
      for (const int r : receivers) world_.send({&steps, 1}, r, kDumpTag);
    }
    if (!receives) continue;
    if (param != current_param) {
      hand_on();
      current_param = param;
    }
    const int k = sched_->lowered.param_tp.at(param);
    // The shard's tensors: names, axes and shapes, and of each the parts
    // this rank receives (empty for the others).
    const std::vector<ShardTensor> shard = shard_tensors(param);
    const size_t n = shard.size();
    std::vector<std::array<Tensor, 3>> parts(n);
    int64_t adam_steps = 0;
    if (holder == rank_) {
      const ParamState& ps = params_.at(key);
      for (size_t i = 0; i < n; ++i)
        parts[i] = {mine[0] ? to_host(backend_, ps.set.params[i].value) : Tensor(), mine[1] ? mv[i] : Tensor(),
                    mine[2] ? mv[n + i] : Tensor()};
      adam_steps = ps.adam_steps;
    } else {
      for (size_t i = 0; i < n; ++i)
        for (int part = 0; part < 3; ++part) {
          if (!mine[static_cast<size_t>(part)]) continue;
          Tensor& x = parts[i][static_cast<size_t>(part)];
          x = Tensor::zeros(shard[i].shape);
          world_.recv({x.data(), static_cast<size_t>(x.numel())}, holder, kDumpTag);
        }
      float steps = 0;
      world_.recv({&steps, 1}, holder, kDumpTag);
      adam_steps = static_cast<int64_t>(steps);
    }
    for (size_t i = 0; i < n; ++i) {
      const ShardTensor& p = shard[i];
      auto [it, fresh] = current.try_emplace(p.name);
      TensorState& ts = it->second;
      if (fresh) ts.adam_steps = adam_steps;
      if (mine[0] && !fresh && !plan::tp_copy_counts(p.shard_axis, t) && drift)
        add_drift(*drift, p.name, parts[i][0], ts.value);
      for (int part = 0; part < 3; ++part) {
        if (!mine[static_cast<size_t>(part)]) continue;
        const Tensor& got = parts[i][static_cast<size_t>(part)];
        if (fresh && plan::tp_copy_counts(p.shard_axis, t) && p.shape == p.full_shape) {
          // The shard is the whole tensor: handed on as it is, no copy (a
          // view of this rank's own state, or what was received; read only).
          ts.part(part) = got;
          continue;
        }
        if (fresh) ts.part(part) = Tensor::zeros(p.full_shape);
        if (plan::tp_copy_counts(p.shard_axis, t)) place_shard(ts.part(part), got, p.shard_axis, t, k);
      }
    }
  }
  hand_on();
}

std::map<std::string, Tensor> Executor::gather_params(ReplicaDrift* drift) {
  TrainingState state = gather_state();
  if (drift) *drift = state.drift;
  std::map<std::string, Tensor> out;
  for (auto& [name, ts] : state.tensors) out.emplace(name, std::move(ts.value));
  return out;
}

void Executor::gather_summed_grads() {
  const plan::Lowered& l = sched_->lowered;
  for (size_t b = 0; l.sharded_state && b < l.buckets.size(); ++b) {
    if (!in_bucket(b)) continue;
    const Tensor all = gather_chunks(static_cast<int>(b), Part::grad, false);
    for_each_tensor(static_cast<int>(b), [&](const plan::ShardKey&, ParamState& ps, size_t i, int64_t off) {
      Param& p = ps.set.params[i];
      backend_.copy(flat_view(all, off, p.grad.numel()), p.grad);
    });
  }
}

std::map<std::string, Tensor> Executor::gather_grads() {
  // After a reduce-scatter (sharded state) each holder has the sum of its
  // own chunk alone: every holder gathers the whole sum first.
  gather_summed_grads();
  std::map<std::string, Tensor> out;
  for (const auto& [key, devs] : sched_->lowered.shard_devices) {
    const auto& [param, t] = key;
    const int holder = *devs.begin();  // after the sync every holder has the same sum
    if (holder == rank_ && rank_ != 0) {
      std::vector<float> packed;
      for (const Param& p : params_.at(key).set.params) {
        const Tensor h = to_host(backend_, p.grad);
        packed.insert(packed.end(), h.data(), h.data() + h.numel());
      }
      world_.send(packed, 0, kDumpTag);
    }
    if (rank_ != 0) continue;
    const std::vector<ShardTensor> shard = shard_tensors(param);
    std::vector<Tensor> grads;
    if (holder == 0) {
      for (const Param& p : params_.at(key).set.params) grads.push_back(to_host(backend_, p.grad));
    } else {
      int64_t values = 0;
      for (const ShardTensor& st : shard) values += shape_numel(st.shape);
      std::vector<float> packed(static_cast<size_t>(values));
      world_.recv(packed, holder, kDumpTag);
      const float* src = packed.data();
      for (const ShardTensor& st : shard) {
        grads.push_back(Tensor::zeros(st.shape));
        std::copy(src, src + grads.back().numel(), grads.back().data());
        src += grads.back().numel();
      }
    }
    const int k = sched_->lowered.param_tp.at(param);
    for (size_t i = 0; i < shard.size(); ++i) {
      const ShardTensor& p = shard[i];
      auto [it, fresh] = out.try_emplace(p.name);
      if (fresh) it->second = Tensor::zeros(p.full_shape);
      // A replicated tensor's gradient is the same on every TP rank: rank 0's.
      if (plan::tp_copy_counts(p.shard_axis, t)) place_shard(it->second, grads[i], p.shard_axis, t, k);
    }
  }
  return out;
}

LoadCounts Executor::load_state(const TrainingState& state) {
  return load_state(
      [&](const std::string& name) -> const TensorState* {
        const auto it = state.tensors.find(name);
        return it == state.tensors.end() ? nullptr : &it->second;
      },
      state.step);
}

LoadCounts Executor::load_state(const StateSource& source, int64_t step) {
  if (values_partial_)   // tensors the state lacks would keep a partial value
    throw std::logic_error("load_state after a step that left the values to the next step's all-gathers");
  LoadCounts counts;
  for (auto& [key, ps] : params_) {
    const int t = key.second;
    const int k = sched_->lowered.param_tp.count(key.first) ? sched_->lowered.param_tp.at(key.first) : 1;
    for (size_t i = 0; i < ps.set.params.size(); ++i) {
      Param& p = ps.set.params[i];
      const TensorState* found = source(p.name);
      const plan::ValueRange own = ps.own[i];
      if (!found) {  // new: keep the seeded initial value
        ps.m[i] = own.size() > 0 ? backend_.allocate({own.size()}) : Tensor();
        ps.v[i] = own.size() > 0 ? backend_.allocate({own.size()}) : Tensor();
        ps.adam_steps = 0;
        ++counts.fresh;
        continue;
      }
      const TensorState& ts = *found;
      if (ts.value.shape() != p.full_shape)
        throw std::invalid_argument(p.name + ": the checkpoint holds shape " + shape_str(ts.value.shape()) +
                                    ", the model needs " + shape_str(p.full_shape));
      // The value whole; the moments for the values this rank owns (ParamState::own).
      for (auto [dst, src] : {std::pair{&p.value, &ts.value}, {&ps.m[i], &ts.m}, {&ps.v[i], &ts.v}}) {
        Tensor local = Tensor::zeros(p.value.shape());  // host staging
        take_shard(local, *src, p.shard_axis, t, k);
        if (dst == &p.value) backend_.copy(local, *dst);
        else if (own.size() > 0) backend_.copy(flat_view(local, own.begin, own.size()), *dst);
      }
      ps.adam_steps = ts.adam_steps;
      ++counts.carried;
    }
  }
  step_ = step;
  return counts;
}

}  // namespace spindle::exec
