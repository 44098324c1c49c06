#include "libexec/exec/executor.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "libexec/exec/eval.h"
#ifdef SPINDLE_HAVE_NCCL
#include "libexec/comm/nccl_comm.h"
#endif
#include "libexec/exec/reshard.h"
#include "libplan/graph/op_graph.h"
#include "libplan/model/ops.h"

namespace spindle::exec {

namespace {

// Tags of point-to-point messages on world: one per wave and direction, and
// one for gathering parameters.
int forward_tag(int wave) { return 2 * wave; }
int backward_tag(int wave) { return 2 * wave + 1; }
constexpr int kDumpTag = 30000;

// Shape of one batch row of an operator's output: [seq, width] for
// activations ([1, out] after pool_project).
Shape out_row_shape(const plan::Operator& op) {
  const plan::Workload& w = op.workload;
  const int64_t seq = w.op == "pool_project" ? 1 : w.seq;
  return {seq, plan::op_out_width(w.op, w.dims)};
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

// Sums the tensors `grads` (backend memory) over `comm`, in place, as one
// flat buffer: in device memory when `comm` is NCCL, else staged through host
// memory (MPI and the fakes carry host buffers). Returns the element count.
int64_t all_reduce_flat(Backend& be, Comm& comm, const std::vector<Tensor*>& grads) {
  int64_t n = 0;
  for (const Tensor* g : grads) n += g->numel();
  Tensor flat;
#ifdef SPINDLE_HAVE_NCCL
  auto* nccl = be.device() == Device::cuda ? dynamic_cast<NcclComm*>(&comm) : nullptr;
  if (nccl) flat = be.allocate({n});
#endif
  if (flat.empty()) flat = Tensor::zeros({n});
  int64_t off = 0;
  for (const Tensor* g : grads) {
    Tensor dst = row_view(flat, off, g->numel());
    be.copy(*g, dst);
    off += g->numel();
  }
  if (flat.device() == Device::host) {
    be.synchronize();
    comm.all_reduce_sum({flat.data(), static_cast<size_t>(n)});
  }
#ifdef SPINDLE_HAVE_NCCL
  else {
    nccl->all_reduce_sum_device(flat.data(), n);
  }
#endif
  off = 0;
  for (Tensor* g : grads) {
    be.copy(row_view(flat, off, g->numel()), *g);
    off += g->numel();
  }
  return n;
}

// One rank's sends and receives of one wave's transfers (tensors in the
// backend's memory), posted together by exchange().
struct Exchange {
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

  int64_t floats_sent() const {
    int64_t n = 0;
    for (const Send& s : sends) n += s.data.numel();
    return n;
  }
};

// Runs `ex` over `comm` (Comm::exchange: every send and receive at once) and
// returns the received tensors, in the backend's memory, in ex.recvs order.
// A CUDA backend with an NCCL comm sends device memory directly (one NCCL
// group); otherwise the data is staged through host memory.
std::vector<Tensor> exchange(Backend& be, Comm& comm, const Exchange& ex, int tag) {
  std::vector<Tensor> got;
#ifdef SPINDLE_HAVE_NCCL
  if (auto* nccl = be.device() == Device::cuda ? dynamic_cast<NcclComm*>(&comm) : nullptr) {
    std::vector<NcclComm::Transfer> sends, recvs;
    for (const Exchange::Send& s : ex.sends)
      sends.push_back({const_cast<float*>(s.data.data()), s.data.numel(), s.peer});
    for (const Exchange::Recv& r : ex.recvs) {
      got.push_back(be.allocate(r.shape));
      recvs.push_back({got.back().data(), got.back().numel(), r.peer});
    }
    nccl->exchange_device(sends, recvs);
    return got;
  }
#endif
  std::vector<Tensor> staged;  // host copies of the sends
  std::vector<Comm::SendBuf> sends;
  std::vector<Comm::RecvBuf> recvs;
  for (const Exchange::Send& s : ex.sends) {
    staged.push_back(to_host(be, s.data));
    sends.push_back({{staged.back().data(), static_cast<size_t>(staged.back().numel())}, s.peer});
  }
  for (const Exchange::Recv& r : ex.recvs) {
    got.push_back(Tensor::zeros(r.shape));
    recvs.push_back({{got.back().data(), static_cast<size_t>(got.back().numel())}, r.peer});
  }
  comm.exchange(sends, recvs, tag);
  for (Tensor& t : got) t = to_backend(be, t);
  return got;
}

// Every rank's `x` (backend memory) stacked along dimension 0 in rank order,
// in the backend's memory: NCCL's all-gather on device memory with a CUDA
// backend and an NCCL comm, else the host all-gather, staged.
Tensor all_gather_rows(Backend& be, Comm& comm, const Tensor& x) {
  Shape shape = x.shape();
  shape[0] *= comm.size();
#ifdef SPINDLE_HAVE_NCCL
  if (auto* nccl = be.device() == Device::cuda ? dynamic_cast<NcclComm*>(&comm) : nullptr) {
    Tensor out = be.allocate(shape);
    nccl->all_gather_device(x.data(), out.data(), x.numel());
    return out;
  }
#endif
  const Tensor staged = to_host(be, x);
  Tensor out = Tensor::zeros(shape);
  comm.all_gather({staged.data(), static_cast<size_t>(staged.numel())}, {out.data(), static_cast<size_t>(out.numel())});
  return to_backend(be, out);
}

// A Comm that only answers rank() and size(): for building shapes of a
// shard with make_params.
class ShapeComm final : public Comm {
 public:
  ShapeComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(std::span<float>) override { fail(); }
  void all_gather(std::span<const float>, std::span<float>) override { fail(); }
  void send(std::span<const float>, int, int) override { fail(); }
  void recv(std::span<float>, int, int) override { fail(); }
  void barrier() override { fail(); }

 private:
  [[noreturn]] static void fail() { throw std::logic_error("ShapeComm cannot communicate"); }
  int rank_, size_;
};

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
// The schedule: everything every rank derives identically from (model, plan).

struct SliceInfo {
  int wave = 0;
  int metaop = 0;
  std::vector<int> ops;       // graph operator indices, in chain order
  std::vector<int> devices;   // ascending
  RowLayout layout;
  std::vector<int> producers; // operators feeding ops[0], in the node's input order
};

struct Transfer {
  int slice = 0;     // consumer slice
  int input = 0;     // index into its producers
  int producer = 0;  // graph operator
  int src_device = 0, dst_device = 0;
  RowRange rows;
};

struct Schedule {
  plan::OpGraph graph;
  std::vector<SliceInfo> slices;               // wave by wave, in plan order
  std::vector<std::vector<int>> wave_slices;   // wave -> slice indices
  std::vector<int> slice_of;                   // graph operator -> slice (-1: none)
  std::vector<std::vector<Transfer>> fwd, bwd; // per wave
  // (param "M/k.r", TP rank) -> devices holding that shard; plus K.
  std::map<std::pair<std::string, int>, std::set<int>> shard_devices;
  std::map<std::string, int> param_tp;
  std::map<std::string, int> param_op;         // param -> one operator using it

  Schedule(const plan::Model& model, const plan::Plan& plan);
  int position(int slice, int device) const {
    const auto& d = slices[static_cast<size_t>(slice)].devices;
    const auto it = std::find(d.begin(), d.end(), device);
    return it == d.end() ? -1 : static_cast<int>(it - d.begin());
  }
};

Schedule::Schedule(const plan::Model& model, const plan::Plan& plan) : graph(plan::expand(model)) {
  std::map<std::string, int> op_index;
  for (size_t i = 0; i < graph.ops.size(); ++i) op_index[graph.ops[i].id] = static_cast<int>(i);
  // Last operator of every (task, node), for the node's ordered inputs.
  std::map<std::pair<int, int>, int> node_last;
  for (size_t i = 0; i < graph.ops.size(); ++i)
    node_last[{graph.ops[i].task, graph.ops[i].node}] = static_cast<int>(i);

  slice_of.assign(graph.ops.size(), -1);
  wave_slices.resize(plan.waves.size());
  for (const plan::Wave& wave : plan.waves) {
    for (const plan::Slice& s : wave.slices) {
      if (s.metaop < 0 || s.metaop >= static_cast<int>(plan.metaops.size()))
        throw std::invalid_argument("slice names unknown MetaOp " + std::to_string(s.metaop));
      const plan::PlanMetaOp& m = plan.metaops[static_cast<size_t>(s.metaop)];
      SliceInfo info;
      info.wave = wave.index;
      info.metaop = s.metaop;
      info.devices = s.devices;
      std::sort(info.devices.begin(), info.devices.end());
      for (int j = s.first; j < s.first + s.count; ++j) {
        const auto it = op_index.find(m.operators.at(static_cast<size_t>(j)));
        if (it == op_index.end())
          throw std::invalid_argument("plan names unknown operator " + m.operators[static_cast<size_t>(j)]);
        info.ops.push_back(it->second);
      }
      const plan::Operator& first = graph.ops[static_cast<size_t>(info.ops[0])];
      info.layout = {first.workload.batch, static_cast<int>(info.devices.size()), first.tensor_parallel};
      if (info.layout.devices % info.layout.tp != 0 || info.layout.batch % info.layout.groups() != 0)
        throw std::invalid_argument("slice of MetaOp " + std::to_string(s.metaop) + " on " +
                                    std::to_string(info.layout.devices) + " devices does not split batch " +
                                    std::to_string(info.layout.batch) + " with tensor_parallel " +
                                    std::to_string(info.layout.tp));
      if (first.block == 0 && first.rep == 0) {
        const plan::Task& task = model.tasks[static_cast<size_t>(first.task)];
        for (const std::string& in : task.nodes[static_cast<size_t>(first.node)].inputs) {
          int n = 0;
          while (task.nodes[static_cast<size_t>(n)].id != in) ++n;
          info.producers.push_back(node_last.at({first.task, n}));
        }
      } else {
        info.producers = first.inputs;
      }
      const int index = static_cast<int>(slices.size());
      for (int o : info.ops) slice_of[static_cast<size_t>(o)] = index;
      wave_slices[static_cast<size_t>(wave.index)].push_back(index);
      // Shard groups: device at position i holds (param, i % K).
      for (int o : info.ops) {
        const plan::Operator& op = graph.ops[static_cast<size_t>(o)];
        if (op.workload.op == "contrastive_loss") continue;
        param_tp[op.param] = op.tensor_parallel;
        param_op.emplace(op.param, o);
        for (size_t i = 0; i < info.devices.size(); ++i)
          shard_devices[{op.param, info.layout.tp_rank_of(static_cast<int>(i))}].insert(info.devices[i]);
      }
      slices.push_back(std::move(info));
    }
  }
  for (size_t o = 0; o < graph.ops.size(); ++o)
    if (slice_of[o] < 0) throw std::invalid_argument("operator " + graph.ops[o].id + " is in no slice");

  // Transfers: per wave, per slice, per input, the moves in a fixed order.
  fwd.resize(plan.waves.size());
  bwd.resize(plan.waves.size());
  for (size_t si = 0; si < slices.size(); ++si) {
    const SliceInfo& c = slices[si];
    for (size_t k = 0; k < c.producers.size(); ++k) {
      const int p = c.producers[k];
      const SliceInfo& ps = slices[static_cast<size_t>(slice_of[static_cast<size_t>(p)])];
      if (ps.wave >= c.wave)
        throw std::invalid_argument("operator " + graph.ops[static_cast<size_t>(c.ops[0])].id +
                                    " runs no later than its input");
      for (const RowMove& m : forward_moves(ps.layout, c.layout))
        fwd[static_cast<size_t>(c.wave)].push_back(
            {static_cast<int>(si), static_cast<int>(k), p, ps.devices[static_cast<size_t>(m.src)],
             c.devices[static_cast<size_t>(m.dst)], m.rows});
      for (const RowMove& m : backward_moves(ps.layout, c.layout))
        bwd[static_cast<size_t>(c.wave)].push_back(
            {static_cast<int>(si), static_cast<int>(k), p, c.devices[static_cast<size_t>(m.src)],
             ps.devices[static_cast<size_t>(m.dst)], m.rows});
    }
  }
}

std::vector<std::vector<int>> Executor::device_groups(const plan::Model& model, const plan::Plan& plan) {
  const Schedule s(model, plan);
  std::set<std::vector<int>> out;
  for (const SliceInfo& si : s.slices) {
    out.insert(si.devices);
    const int k = si.layout.tp;
    for (int g = 0; k > 1 && g < si.layout.groups(); ++g)
      out.insert(std::vector<int>(si.devices.begin() + g * k, si.devices.begin() + (g + 1) * k));
  }
  for (const auto& [key, devs] : s.shard_devices) out.insert(std::vector<int>(devs.begin(), devs.end()));
  return {out.begin(), out.end()};
}

// ---------------------------------------------------------------------------

struct Executor::ParamState {
  ParamSet set;
  std::vector<Tensor> m, v;  // AdamW moments, one per tensor of set
  int64_t adam_steps = 0;    // AdamW steps taken (bias correction); step_ unless resumed as new
  std::vector<int> sync;     // devices holding this shard (ascending)
};

Executor::Executor(const plan::Model& model, const plan::Plan& plan, Comm& world, GroupComms groups,
                   Backend& backend, ExecOptions options)
    : model_(model), plan_(plan), world_(world), groups_(std::move(groups)), backend_(backend),
      options_(options), rank_(world.rank()), sched_(std::make_unique<Schedule>(model, plan)),
      loss_(model.tasks.size(), 0.0), synthetic_(std::make_unique<SyntheticSource>(options.seed)),
      data_(synthetic_.get()), origin_(Clock::now()) {
  if (world.size() != plan.devices)
    throw std::invalid_argument("the plan is for " + std::to_string(plan.devices) +
                                " devices but the world has " + std::to_string(world.size()) + " ranks");
  auto comm_of = [&](const std::vector<int>& devs) -> Comm* {
    const auto it = groups_.find(devs);
    if (it == groups_.end())
      throw std::invalid_argument("no communicator for a device group of rank " + std::to_string(rank_));
    return it->second.get();
  };
  // Ops (and the parameter shards they use) of every slice on this device.
  for (size_t si = 0; si < sched_->slices.size(); ++si) {
    const SliceInfo& s = sched_->slices[si];
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
      cfg.tp = tp;
      auto [it, fresh] = params_.try_emplace({op.param, t});
      ParamState& ps = it->second;
      if (fresh) {
        // Seeded on the host, then resident in the backend's memory for the
        // whole run: value, gradient and AdamW moments.
        ps.set = make_params(cfg, op.param, options_.seed);
        for (Param& p : ps.set.params) {
          p.value = to_backend(backend_, p.value);
          p.grad = backend_.allocate(p.value.shape());
          ps.m.push_back(backend_.allocate(p.value.shape()));
          ps.v.push_back(backend_.allocate(p.value.shape()));
        }
        const auto devs = sched_->shard_devices.find({op.param, t});
        if (devs != sched_->shard_devices.end()) ps.sync.assign(devs->second.begin(), devs->second.end());
        else ps.sync = {rank_};  // no parameters (contrastive_loss)
      }
      ops_.emplace(o, make_op(cfg, ps.set));
    }
  }
}

Executor::~Executor() = default;

// ---------------------------------------------------------------------------
// The training step.

StepStats Executor::step() {
  const Clock::time_point start = Clock::now();
  ++step_;
  out_.clear();
  dout_.clear();
  pieces_.clear();
  din_.clear();
  std::fill(loss_.begin(), loss_.end(), 0.0);
  data_batch_ = step_ - 1;
  zero_grads();
  const int waves = static_cast<int>(plan_.waves.size());

  // Forward, waves in order: receive each slice's inputs, then run this
  // device's slices.
  for (int w = 0; w < waves; ++w) {
    forward_transfers(w);
    for (int s : sched_->wave_slices[static_cast<size_t>(w)])
      if (sched_->position(s, rank_) >= 0) forward_slice(s);
  }
  // Backward, waves reversed: run this device's slices backwards, then send
  // the input gradients to the devices that produced the inputs.
  for (int w = waves - 1; w >= 0; --w) {
    const auto& in_wave = sched_->wave_slices[static_cast<size_t>(w)];
    for (auto it = in_wave.rbegin(); it != in_wave.rend(); ++it)
      if (sched_->position(*it, rank_) >= 0) backward_slice(*it);
    backward_transfers(w);
  }
  // Gradient sync: sum each parameter shard over the devices holding it.
  sync_gradients();
  // Optimizer step: AdamW on every shard held here.
  optimizer_step();

  // Losses: each rank holds its share of every task's full-batch loss.
  StepStats stats;
  stats.step = step_;
  std::vector<float> loss(loss_.begin(), loss_.end());
  world_.all_reduce_sum(loss);
  stats.task_loss.assign(loss.begin(), loss.end());
  stats.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return stats;
}

// ---------------------------------------------------------------------------
// Phases.

void Executor::forward_transfers(int wave) {
  const Clock::time_point t0 = Clock::now();
  // Pieces for this rank's slices in schedule order (local ones copied here,
  // the others received), so each input's rows concatenate in order.
  std::vector<std::pair<std::pair<int, int>, Tensor>> arrived;
  std::vector<size_t> received;  // indices into arrived, in recv order
  Exchange ex;
  for (const Transfer& t : sched_->fwd[static_cast<size_t>(wave)]) {
    if (t.src_device != rank_ && t.dst_device != rank_) continue;
    const plan::Operator& p = sched_->graph.ops[static_cast<size_t>(t.producer)];
    if (t.src_device == rank_) {
      const int ps = sched_->slice_of[static_cast<size_t>(t.producer)];
      const RowRange mine = sched_->slices[static_cast<size_t>(ps)].layout.rows_of(sched_->position(ps, rank_));
      Tensor piece = copy_rows(backend_, out_.at(t.producer), t.rows.begin - mine.begin, t.rows.size());
      if (t.dst_device == rank_) arrived.push_back({{t.slice, t.input}, std::move(piece)});
      else ex.sends.push_back({std::move(piece), t.dst_device});
    } else {
      received.push_back(arrived.size());
      arrived.push_back({{t.slice, t.input}, Tensor()});
      ex.recvs.push_back({with_rows(t.rows.size(), out_row_shape(p)), t.src_device});
    }
  }
  const int64_t sent = ex.floats_sent();
  std::vector<Tensor> got = exchange(backend_, world_, ex, forward_tag(wave));
  for (size_t i = 0; i < got.size(); ++i) arrived[received[i]].second = std::move(got[i]);
  for (auto& [key, piece] : arrived) pieces_[key].push_back(std::move(piece));
  if (!sched_->fwd[static_cast<size_t>(wave)].empty())
    record("transfer fwd wave " + std::to_string(wave), "transfer", 1, t0, {{"floats_sent", sent}});
}

void Executor::forward_slice(int slice) {
  const Clock::time_point t0 = Clock::now();
  const SliceInfo& s = sched_->slices[static_cast<size_t>(slice)];
  const int pos = sched_->position(slice, rank_);
  const RowRange rows = s.layout.rows_of(pos);
  for (size_t j = 0; j < s.ops.size(); ++j) {
    const int o = s.ops[j];
    const plan::Operator& op = sched_->graph.ops[static_cast<size_t>(o)];
    const plan::Task& task = model_.tasks[static_cast<size_t>(op.task)];
    const std::string& kind = op.workload.op;
    std::vector<Tensor> in;
    if (kind == "patch_embed" || kind == "token_embed") {
      in.push_back(to_backend(backend_, read_rows(op, rows.begin, rows.end)));
    } else if (j > 0) {
      in.push_back(out_.at(s.ops[j - 1]));
    } else {
      for (size_t k = 0; k < s.producers.size(); ++k)
        in.push_back(concat_rows(backend_, pieces_.at({slice, static_cast<int>(k)})));
      if (kind == "contrastive_loss") {
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
    if (kind == "lm_loss") {
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
  }
  const plan::Operator& first = sched_->graph.ops[static_cast<size_t>(s.ops.front())];
  record("fwd " + first.id + " x" + std::to_string(s.ops.size()), "compute", 0, t0,
         {{"metaop", s.metaop}, {"wave", s.wave}, {"rows", rows.size()}});
}

void Executor::backward_slice(int slice) {
  const Clock::time_point t0 = Clock::now();
  const SliceInfo& s = sched_->slices[static_cast<size_t>(slice)];
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
      dy = dout_.at(o);
    }
    std::vector<Tensor> dx = backend_.backward(ops_.at(o), dy);
    if (dx.empty()) continue;  // data readers
    if (j > 0) {
      dout_[s.ops[j - 1]] = std::move(dx[0]);
    } else if (kind == "contrastive_loss") {
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
  const plan::Operator& first = sched_->graph.ops[static_cast<size_t>(s.ops.front())];
  record("bwd " + first.id + " x" + std::to_string(s.ops.size()), "compute", 0, t0,
         {{"metaop", s.metaop}, {"wave", s.wave}, {"rows", rows.size()}});
}

void Executor::backward_transfers(int wave) {
  const Clock::time_point t0 = Clock::now();
  // Gradient pieces for this rank's producers in schedule order (local ones
  // copied here, the others received); they are added up in that order.
  std::vector<std::pair<const Transfer*, Tensor>> arrived;
  std::vector<size_t> received;  // indices into arrived, in recv order
  Exchange ex;
  for (const Transfer& t : sched_->bwd[static_cast<size_t>(wave)]) {
    if (t.src_device != rank_ && t.dst_device != rank_) continue;
    const plan::Operator& p = sched_->graph.ops[static_cast<size_t>(t.producer)];
    if (t.src_device == rank_) {
      const RowRange mine =
          sched_->slices[static_cast<size_t>(t.slice)].layout.rows_of(sched_->position(t.slice, rank_));
      Tensor piece = copy_rows(backend_, din_.at({t.slice, t.input}), t.rows.begin - mine.begin, t.rows.size());
      if (t.dst_device == rank_) arrived.push_back({&t, std::move(piece)});
      else ex.sends.push_back({std::move(piece), t.dst_device});
    } else {
      received.push_back(arrived.size());
      arrived.push_back({&t, Tensor()});
      ex.recvs.push_back({with_rows(t.rows.size(), out_row_shape(p)), t.src_device});
    }
  }
  const int64_t sent = ex.floats_sent();
  std::vector<Tensor> got = exchange(backend_, world_, ex, backward_tag(wave));
  for (size_t i = 0; i < got.size(); ++i) arrived[received[i]].second = std::move(got[i]);
  // Accumulate into the producers' output gradients (several consumers add up).
  for (const auto& [t, piece] : arrived) {
    const plan::Operator& p = sched_->graph.ops[static_cast<size_t>(t->producer)];
    const int ps = sched_->slice_of[static_cast<size_t>(t->producer)];
    const RowRange mine = sched_->slices[static_cast<size_t>(ps)].layout.rows_of(sched_->position(ps, rank_));
    auto [it, fresh] = dout_.try_emplace(t->producer);
    if (fresh) it->second = backend_.allocate(with_rows(mine.size(), out_row_shape(p)));
    Tensor dst = row_view(it->second, t->rows.begin - mine.begin, t->rows.size());
    backend_.add(piece, dst);
  }
  if (!sched_->bwd[static_cast<size_t>(wave)].empty())
    record("transfer bwd wave " + std::to_string(wave), "transfer", 1, t0, {{"floats_sent", sent}});
}

void Executor::zero_grads() {
  for (auto& [key, ps] : params_)
    for (Param& p : ps.set.params) {
      if (p.grad.device() == Device::host) p.grad.zero();
      else p.grad = backend_.allocate(p.grad.shape());  // zero-filled (Backend has no fill)
    }
}

void Executor::sync_gradients() {
  const Clock::time_point t0 = Clock::now();
  // One bucket per device group, in the group's sorted order (the same on
  // every member); within a bucket, shards in key order.
  std::map<std::vector<int>, std::vector<ParamState*>> buckets;
  for (auto& [key, ps] : params_) buckets[ps.sync].push_back(&ps);
  int64_t floats = 0;
  for (auto& [devs, states] : buckets) {
    if (devs.size() < 2) continue;
    std::vector<Tensor*> grads;
    for (ParamState* ps : states)
      for (Param& p : ps->set.params) grads.push_back(&p.grad);
    floats += all_reduce_flat(backend_, *groups_.at(devs), grads);
  }
  record("gradient sync", "sync", 1, t0, {{"floats", floats}});
}

void Executor::optimizer_step() {
  const Clock::time_point t0 = Clock::now();
  for (auto& [key, ps] : params_) {
    ++ps.adam_steps;
    for (size_t i = 0; i < ps.set.params.size(); ++i) {
      Param& p = ps.set.params[i];
      backend_.adamw_step(options_.adamw, ps.adam_steps, p.value, p.grad, ps.m[i], ps.v[i]);
    }
  }
  record("optimizer", "compute", 0, t0);
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
  const SliceInfo& s = sched_->slices[static_cast<size_t>(slice)];
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
  for (size_t si = 0; si < sched_->slices.size(); ++si) {
    const SliceInfo& s = sched_->slices[si];
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
  DataSource* const training = data_;
  data_ = &source;
  data_batch_ = batch;
  eval_ = &stats;
  out_.clear();
  pieces_.clear();
  std::fill(loss_.begin(), loss_.end(), 0.0);
  for (int w = 0; w < static_cast<int>(plan_.waves.size()); ++w) {
    forward_transfers(w);
    for (int s : sched_->wave_slices[static_cast<size_t>(w)])
      if (sched_->position(s, rank_) >= 0) forward_slice(s);
  }
  eval_ = nullptr;
  data_ = training;
  out_.clear();
  pieces_.clear();
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

void Executor::record(const std::string& name, const char* cat, int track, Clock::time_point t0,
                      nlohmann::json args) {
  if (!options_.record_trace) return;
  // A device backend returns before its work is done: wait for it, so that
  // each box holds its own work (tracing serialises host and device).
  backend_.synchronize();
  const Clock::time_point t1 = Clock::now();
  args["step"] = step_;
  if (eval_) args["eval"] = true;  // an evaluation after step step_
  trace_.push_back({name, cat, rank_, track, wall_us(t0), wall_us(t1) - wall_us(t0), std::move(args)});
}

ParamSet Executor::shard_shapes(const std::string& param, int tp_rank) const {
  const int k = sched_->param_tp.at(param);
  const plan::Operator& op = sched_->graph.ops[static_cast<size_t>(sched_->param_op.at(param))];
  const plan::Task& task = model_.tasks[static_cast<size_t>(op.task)];
  ShapeComm shape_comm(tp_rank, k);
  OpConfig cfg;
  cfg.kind = op_kind(op.workload.op).value();
  cfg.dims = op.workload.dims;
  cfg.max_seq = model_.find_module(task.nodes[static_cast<size_t>(op.node)].module)->max_seq;
  cfg.tp = k > 1 ? &shape_comm : nullptr;
  return make_params(cfg, param, 0);
}

std::map<std::string, Shape> Executor::param_shapes() const {
  std::map<std::string, Shape> out;
  for (const auto& [param, o] : sched_->param_op)
    for (const Param& p : shard_shapes(param, 0).params) out[p.name] = p.full_shape;
  return out;
}

TrainingState Executor::gather_state() {
  TrainingState out;
  out.step = step_;
  for (const auto& [key, devs] : sched_->shard_devices) {
    const auto& [param, t] = key;
    const int holder = *devs.begin();
    // One message per shard: every tensor's value, m, v, then the AdamW step
    // count (as a float: exact below 2^24 steps).
    if (holder == rank_ && rank_ != 0) {
      const ParamState& ps = params_.at(key);
      std::vector<float> packed;
      for (size_t i = 0; i < ps.set.params.size(); ++i)
        for (const Tensor* x : {&ps.set.params[i].value, &ps.m[i], &ps.v[i]}) {
          const Tensor h = to_host(backend_, *x);
          packed.insert(packed.end(), h.data(), h.data() + h.numel());
        }
      packed.push_back(static_cast<float>(ps.adam_steps));
      world_.send(packed, 0, kDumpTag);
    }
    if (rank_ != 0) continue;
    const int k = sched_->param_tp.at(param);
    ParamSet shard;
    std::vector<Tensor> m, v;
    int64_t adam_steps = 0;
    if (holder == 0) {
      const ParamState& ps = params_.at(key);
      shard = ps.set;
      for (size_t i = 0; i < shard.params.size(); ++i) {
        shard.params[i].value = to_host(backend_, ps.set.params[i].value);
        m.push_back(to_host(backend_, ps.m[i]));
        v.push_back(to_host(backend_, ps.v[i]));
      }
      adam_steps = ps.adam_steps;
    } else {
      shard = shard_shapes(param, t);
      std::vector<float> packed(static_cast<size_t>(3 * shard.local_count() + 1));
      world_.recv(packed, holder, kDumpTag);
      const float* src = packed.data();
      for (Param& p : shard.params) {
        m.push_back(Tensor::zeros(p.value.shape()));
        v.push_back(Tensor::zeros(p.value.shape()));
        for (Tensor* x : {&p.value, &m.back(), &v.back()}) {
          std::copy(src, src + x->numel(), x->data());
          src += x->numel();
        }
      }
      adam_steps = static_cast<int64_t>(packed.back());
    }
    for (size_t i = 0; i < shard.params.size(); ++i) {
      const Param& p = shard.params[i];
      auto [it, fresh] = out.tensors.try_emplace(p.name);
      TensorState& ts = it->second;
      if (fresh) {
        ts.value = Tensor::zeros(p.full_shape);
        ts.m = Tensor::zeros(p.full_shape);
        ts.v = Tensor::zeros(p.full_shape);
        ts.adam_steps = adam_steps;
      }
      if (p.shard_axis >= 0 || t == 0) {
        place_shard(ts.value, p.value, p.shard_axis, t, k);
        place_shard(ts.m, m[i], p.shard_axis, t, k);
        place_shard(ts.v, v[i], p.shard_axis, t, k);
      }
    }
  }
  return out;
}

std::map<std::string, Tensor> Executor::gather_params() {
  std::map<std::string, Tensor> out;
  for (auto& [name, ts] : gather_state().tensors) out.emplace(name, std::move(ts.value));
  return out;
}

LoadCounts Executor::load_state(const TrainingState& state) {
  LoadCounts counts;
  for (auto& [key, ps] : params_) {
    const int t = key.second;
    const int k = sched_->param_tp.count(key.first) ? sched_->param_tp.at(key.first) : 1;
    for (size_t i = 0; i < ps.set.params.size(); ++i) {
      Param& p = ps.set.params[i];
      const auto it = state.tensors.find(p.name);
      if (it == state.tensors.end()) {  // new: keep the seeded initial value
        ps.m[i] = backend_.allocate(p.value.shape());
        ps.v[i] = backend_.allocate(p.value.shape());
        ps.adam_steps = 0;
        ++counts.fresh;
        continue;
      }
      const TensorState& ts = it->second;
      if (ts.value.shape() != p.full_shape)
        throw std::invalid_argument(p.name + ": the checkpoint holds shape " + shape_str(ts.value.shape()) +
                                    ", the model needs " + shape_str(p.full_shape));
      for (auto [dst, src] : {std::pair{&p.value, &ts.value}, {&ps.m[i], &ts.m}, {&ps.v[i], &ts.v}}) {
        Tensor local = Tensor::zeros(dst->shape());  // host staging
        take_shard(local, *src, p.shard_axis, t, k);
        backend_.copy(local, *dst);
      }
      ps.adam_steps = ts.adam_steps;
      ++counts.carried;
    }
  }
  step_ = state.step;
  return counts;
}

}  // namespace spindle::exec
