#include "libplan/plan/cost_plan.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_map>

#include "libplan/model/ops.h"

namespace spindle::plan {

double output_bytes_per_sample(const Operator& op, int dtype_bytes) {
  int64_t width = op_out_width(op.workload.op, op.workload.dims);
  int64_t seq = op.workload.op == "pool_project" ? 1 : op.workload.seq;
  return static_cast<double>(width * seq * dtype_bytes);
}

namespace {

// Rows [lo, hi) of the batch held by position i of an n-device group with
// tensor_parallel k: n/k data-parallel groups, each of k devices holding the
// same rows.
std::pair<int64_t, int64_t> rows_of(int i, int n, int k, int64_t batch) {
  int groups = n / k;
  int g = i / k;
  return {batch * g / groups, batch * (g + 1) / groups};
}

// Traffic of one wave, accumulated over its re-shardings: bytes into each
// device from its own island, bytes into each island from other islands.
struct WaveTraffic {
  std::vector<double> intra_bytes;   // by destination device
  std::vector<double> inter_bytes;   // by destination island
};

// Moves `bytes_per_sample` x batch rows from group `src` (tensor_parallel
// ksrc) to group `dst` (kdst): each destination device needs its rows and
// takes each from the source replica on itself, else on its island, else the
// first one holding it.
void add_reshard(WaveTraffic& t, const std::vector<int>& src, int ksrc, const std::vector<int>& dst, int kdst,
                 int64_t batch, double bytes_per_sample, int devices_per_island) {
  if (bytes_per_sample <= 0) return;
  const int ns = static_cast<int>(src.size()), nd = static_cast<int>(dst.size());
  for (int j = 0; j < nd; ++j) {
    const int d = dst[j];
    auto [lo, hi] = rows_of(j, nd, kdst, batch);
    // Source data-parallel groups overlapping [lo, hi).
    for (int g = 0; g < ns / ksrc; ++g) {
      auto [slo, shi] = rows_of(g * ksrc, ns, ksrc, batch);
      int64_t rows = std::min(hi, shi) - std::max(lo, slo);
      if (rows <= 0) continue;
      int chosen = -1;
      for (int r = 0; r < ksrc && chosen < 0; ++r)
        if (src[g * ksrc + r] == d) chosen = d;
      for (int r = 0; r < ksrc && chosen < 0; ++r)
        if (src[g * ksrc + r] / devices_per_island == d / devices_per_island) chosen = src[g * ksrc + r];
      if (chosen < 0) chosen = src[g * ksrc];
      if (chosen == d) continue;
      double bytes = static_cast<double>(rows) * bytes_per_sample;
      if (chosen / devices_per_island == d / devices_per_island)
        t.intra_bytes[d] += bytes;
      else
        t.inter_bytes[d / devices_per_island] += bytes;
    }
  }
}

double traffic_ms(const WaveTraffic& t, const CostModel& cost) {
  double ms = 0;
  for (double b : t.intra_bytes)
    if (b > 0) ms = std::max(ms, cost.p2p_ms(b, false));
  for (double b : t.inter_bytes)
    if (b > 0) ms = std::max(ms, cost.p2p_ms(b, true));
  return ms;
}

}  // namespace

void cost_plan(Plan& plan, const Model& model, const OpGraph& graph, const CostModel& cost) {
  const int dtype = dtype_bytes(model.dtype);
  std::unordered_map<std::string_view, int> op_index;
  op_index.reserve(graph.ops.size());
  for (size_t i = 0; i < graph.ops.size(); ++i) op_index.emplace(graph.ops[i].id, static_cast<int>(i));

  // Where each MetaOp's operators ran: per operator position, the slice devices.
  struct Placed { int wave; const Slice* slice; };
  std::vector<std::vector<Placed>> slices_of(plan.metaops.size());
  for (size_t w = 0; w < plan.waves.size(); ++w)
    for (const Slice& s : plan.waves[w].slices) slices_of[s.metaop].push_back({static_cast<int>(w), &s});

  // Per MetaOp, looked up once (the cost model's lookups are by workload
  // key, and every operator of a MetaOp has the MetaOp's workload): its
  // operators' graph indices, and the activation and parameter bytes of one
  // operator. Per operator, its MetaOp (-1: none).
  struct MetaOpCost {
    std::vector<int> ops;
    double act_bytes_per_sample = 0;
    double param_bytes = 0;
  };
  std::vector<MetaOpCost> per_metaop(plan.metaops.size());
  std::vector<int> metaop_of_op(graph.ops.size(), -1);
  for (size_t i = 0; i < plan.metaops.size(); ++i) {
    const PlanMetaOp& m = plan.metaops[i];
    MetaOpCost& c = per_metaop[i];
    for (const std::string& id : m.operators) {
      c.ops.push_back(op_index.at(id));
      metaop_of_op[static_cast<size_t>(c.ops.back())] = static_cast<int>(i);
    }
    c.act_bytes_per_sample = static_cast<double>(cost.activation_bytes_per_sample(m.workload));
    c.param_bytes = static_cast<double>(cost.param_bytes(m.workload));
  }

  // Compute and transfers, wave by wave. Backward moves the same bytes back
  // (activation gradients), so each boundary is paid twice.
  // Per parameter (by name, so param_groups come out sorted): which devices run it.
  std::map<std::string_view, std::vector<char>> param_devices;
  std::vector<double> act_bytes(plan.devices, 0.0);
  Predicted& pred = plan.predicted;
  pred = Predicted{0, 0, 0, 0, pred.relaxed_optimum_ms, std::vector<int64_t>(plan.devices, 0)};
  const int per_island = std::max(1, plan.devices_per_island);
  const int islands = (plan.devices + per_island - 1) / per_island;
  WaveTraffic traffic;
  for (Wave& wave : plan.waves) {
    wave.ms = 0;
    traffic.intra_bytes.assign(static_cast<size_t>(plan.devices), 0.0);
    traffic.inter_bytes.assign(static_cast<size_t>(islands), 0.0);
    for (const Slice& s : wave.slices) {
      wave.ms = std::max(wave.ms, s.ms);
      const PlanMetaOp& m = plan.metaops[s.metaop];
      const int n = static_cast<int>(s.devices.size());
      const MetaOpCost& mc = per_metaop[static_cast<size_t>(s.metaop)];
      for (int k = s.first; k < s.first + s.count; ++k) {
        const Operator& op = graph.ops[static_cast<size_t>(mc.ops[static_cast<size_t>(k)])];
        std::vector<char>& on = param_devices[op.param];
        on.resize(static_cast<size_t>(plan.devices));
        for (int d : s.devices) on[static_cast<size_t>(d)] = 1;
        double act = mc.act_bytes_per_sample * m.workload.batch / n;
        for (int d : s.devices) act_bytes[d] += act;
      }
      // Inputs of this slice: the previous slice of the same MetaOp, or the
      // last slices of the input MetaOps.
      const Operator& first = graph.ops[static_cast<size_t>(mc.ops[static_cast<size_t>(s.first)])];
      if (s.first > 0) {
        const Slice* prev = nullptr;
        for (const Placed& p : slices_of[s.metaop])
          if (p.slice->first + p.slice->count == s.first) prev = p.slice;
        if (prev && prev->devices != s.devices)
          add_reshard(traffic, prev->devices, m.tensor_parallel, s.devices, m.tensor_parallel, m.workload.batch,
                      output_bytes_per_sample(graph.ops[first.inputs.front()], dtype), plan.devices_per_island);
      } else {
        for (int in : m.inputs) {
          if (slices_of[in].empty()) continue;
          const Slice* last = slices_of[in].back().slice;
          const PlanMetaOp& im = plan.metaops[in];
          const Operator& producer = graph.ops[static_cast<size_t>(per_metaop[static_cast<size_t>(in)].ops.back())];
          if (last->devices != s.devices)
            add_reshard(traffic, last->devices, im.tensor_parallel, s.devices, m.tensor_parallel, m.workload.batch,
                        output_bytes_per_sample(producer, dtype), plan.devices_per_island);
        }
      }
    }
    wave.transfer_ms = 2.0 * traffic_ms(traffic, cost);
    pred.compute_ms += wave.ms;
    pred.transfer_ms += wave.transfer_ms;
  }

  // Parameter groups (rule 5), gradient synchronisation and memory.
  std::unordered_map<std::string_view, int> op_of_param;   // first operator of each parameter
  for (size_t i = 0; i < graph.ops.size(); ++i) op_of_param.emplace(graph.ops[i].param, static_cast<int>(i));
  // Per parameter: weights and gradients in the model dtype on every device
  // that runs it; fp32 master copy (unless the dtype is fp32) and AdamW's m
  // and v sharded over the data-parallel replicas of the parameter group, as
  // Megatron's distributed optimizer (ZeRO stage 1) does.
  const double replicated_bytes_per_param = 2.0 * dtype;
  const double optimizer_bytes_per_param = 8.0 + (dtype < 4 ? 4.0 : 0.0);
  std::vector<double> sync_ms(plan.devices, 0.0);
  std::vector<double> state_bytes(plan.devices, 0.0);
  plan.param_groups.clear();
  for (const auto& [param, on] : param_devices) {
    std::vector<int> devices;
    for (size_t d = 0; d < on.size(); ++d)
      if (on[d]) devices.push_back(static_cast<int>(d));
    plan.param_groups.push_back({std::string(param), devices});
    const int index = op_of_param.at(param);
    const Operator& op = graph.ops[static_cast<size_t>(index)];
    const int owner = metaop_of_op[static_cast<size_t>(index)];
    const double param_bytes = owner >= 0 ? per_metaop[static_cast<size_t>(owner)].param_bytes
                                          : static_cast<double>(cost.param_bytes(op.workload));
    const double shard_bytes = param_bytes / op.tensor_parallel;
    const double ms = shard_bytes > 0 ? cost.allreduce_ms(shard_bytes, devices) : 0.0;
    const double replicas = std::max(1.0, static_cast<double>(devices.size()) / op.tensor_parallel);
    const double params_per_device = shard_bytes / dtype;
    for (int d : devices) {
      sync_ms[d] += ms;
      state_bytes[d] += params_per_device * (replicated_bytes_per_param + optimizer_bytes_per_param / replicas);
    }
  }
  for (int d = 0; d < plan.devices; ++d) {
    pred.sync_ms = std::max(pred.sync_ms, sync_ms[d]);
    pred.memory_bytes[d] = static_cast<int64_t>(state_bytes[d] + act_bytes[d]);
  }
  pred.iteration_ms = pred.compute_ms + pred.transfer_ms + pred.sync_ms;
}

}  // namespace spindle::plan
