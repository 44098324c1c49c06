#include "libplan/planner/cost_plan.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "libplan/model/ops.h"
#include "libplan/rules/memory.h"
#include "libplan/rules/rows.h"
#include "libplan/util/limits.h"

namespace spindle::plan {

double output_bytes_per_sample(const Operator& op, int dtype_bytes) {
  return static_cast<double>(op_out_values_per_sample(op.workload.op, op.workload.dims, op.workload.seq) *
                             dtype_bytes);
}

int64_t op_shard_values(const Operator& op, const Model& model) {
  const Task& task = model.tasks[static_cast<size_t>(op.task)];
  const Module* module = model.find_module(task.nodes[static_cast<size_t>(op.node)].module);
  const Workload& w = op.workload;
  return op_shard_param_count(w.op, w.dims, module->max_seq, op.tensor_parallel);
}

namespace {

// Traffic of one wave, accumulated over its re-shardings: bytes into each
// device from its own island, bytes into each island from other islands.
struct WaveTraffic {
  std::vector<double> intra_bytes;   // by destination device
  std::vector<double> inter_bytes;   // by destination island
};

// Moves `bytes_per_sample` x batch rows from group `src` (tensor_parallel
// ksrc) to group `dst` (kdst), as the runtime does (rules/rows.h).
void add_reshard(WaveTraffic& t, const std::vector<int>& src, int ksrc, const std::vector<int>& dst, int kdst,
                 int64_t batch, double bytes_per_sample, int devices_per_island) {
  if (bytes_per_sample <= 0) return;
  for_each_reshard_move(src, ksrc, dst, kdst, batch, devices_per_island, [&](const RowMove& m) {
    if (m.src == m.dst) return;
    const double bytes = static_cast<double>(m.rows.size()) * bytes_per_sample;
    if (island_of(m.src, devices_per_island) == island_of(m.dst, devices_per_island))
      t.intra_bytes[static_cast<size_t>(m.dst)] += bytes;
    else
      t.inter_bytes[static_cast<size_t>(island_of(m.dst, devices_per_island))] += bytes;
  });
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

PlanParams plan_params(const std::vector<std::vector<int>>& ops, const Model& model, const OpGraph& graph,
                       int dtype_bytes) {
  PlanParams out;
  std::vector<std::string_view> names;
  for (const std::vector<int>& list : ops)
    for (int o : list) names.push_back(graph.ops[static_cast<size_t>(o)].param);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::unordered_map<std::string_view, int> param_index;
  param_index.reserve(names.size());
  for (size_t p = 0; p < names.size(); ++p) param_index.emplace(names[p], static_cast<int>(p));
  out.params.resize(names.size());
  std::vector<char> costed(names.size(), 0);
  for (const Operator& op : graph.ops) {
    auto it = param_index.find(op.param);
    if (it == param_index.end() || costed[static_cast<size_t>(it->second)]) continue;
    costed[static_cast<size_t>(it->second)] = 1;
    CostTables::Param& p = out.params[static_cast<size_t>(it->second)];
    p.name = op.param;
    p.shard_bytes = static_cast<double>(op_shard_values(op, model)) * dtype_bytes;
    p.tensor_parallel = op.tensor_parallel;
  }
  out.of_metaop.resize(ops.size());
  for (size_t i = 0; i < ops.size(); ++i)
    for (int o : ops[i]) out.of_metaop[i].push_back(param_index.at(graph.ops[static_cast<size_t>(o)].param));
  return out;
}

CostTables cost_tables(const Plan& plan, const Model& model, const OpGraph& graph, const CostModel& cost) {
  CostTables t;
  t.dtype_bytes = dtype_bytes(model.dtype);
  std::unordered_map<std::string_view, int> op_index;
  op_index.reserve(graph.ops.size());
  for (size_t i = 0; i < graph.ops.size(); ++i) op_index.emplace(graph.ops[i].id, static_cast<int>(i));

  // Per MetaOp its operators' graph indices. The cost model's lookups are
  // by workload key, and every operator of a MetaOp has the MetaOp's
  // workload: once per MetaOp.
  std::vector<std::vector<int>> ops(plan.metaops.size());
  t.metaops.resize(plan.metaops.size());
  for (size_t i = 0; i < plan.metaops.size(); ++i) {
    const PlanMetaOp& m = plan.metaops[i];
    for (const std::string& id : m.operators) ops[i].push_back(op_index.at(id));
    t.metaops[i].act_bytes_per_sample = static_cast<double>(cost.activation_bytes_per_sample(m.workload));
    if (!ops[i].empty())
      t.metaops[i].out_bytes_per_sample =
          output_bytes_per_sample(graph.ops[static_cast<size_t>(ops[i].back())], t.dtype_bytes);
  }

  PlanParams params = plan_params(ops, model, graph, t.dtype_bytes);
  t.params = std::move(params.params);
  for (size_t i = 0; i < plan.metaops.size(); ++i) {
    CostTables::MetaOpCost& c = t.metaops[i];
    c.param = std::move(params.of_metaop[i]);
    for (size_t k = 0; k < ops[i].size(); ++k) {
      const Operator& op = graph.ops[static_cast<size_t>(ops[i][k])];
      c.in_bytes_per_sample.push_back(
          k == 0 || op.inputs.empty()
              ? 0.0
              : output_bytes_per_sample(graph.ops[static_cast<size_t>(op.inputs.front())], t.dtype_bytes));
    }
  }
  return t;
}

void add_held_state(const std::vector<HeldShard>& held, const std::vector<CostTables::Param>& params,
                    int dtype_bytes, OptimizerState state, std::vector<double>& bytes) {
  for (size_t i = 0; i < held.size();) {
    size_t end = i;   // [i, end): the holders of one (param, rank)
    while (end < held.size() && held[end].param == held[i].param && held[end].rank == held[i].rank) ++end;
    const double b = param_state_bytes(params[static_cast<size_t>(held[i].param)].shard_bytes, dtype_bytes,
                                       static_cast<double>(end - i), state);
    for (; i < end; ++i) bytes[static_cast<size_t>(held[i].device)] += b;
  }
}

void cost_plan(Plan& plan, const Model& model, const OpGraph& graph, const CostModel& cost) {
  cost_plan(plan, cost_tables(plan, model, graph, cost), cost);
}

void cost_plan(Plan& plan, const CostTables& tables, const CostModel& cost) {
  // Where each MetaOp's operators ran: its slices in wave order.
  std::vector<std::vector<const Slice*>> slices_of(plan.metaops.size());
  for (const Wave& wave : plan.waves)
    for (const Slice& s : wave.slices) slices_of[static_cast<size_t>(s.metaop)].push_back(&s);

  // Compute and transfers, wave by wave. Backward moves the same bytes back
  // (activation gradients), so each boundary is paid twice.
  // Per parameter (index into tables.params): which devices run it.
  const size_t devices = static_cast<size_t>(plan.devices);
  std::vector<char> runs(tables.params.size() * devices, 0);   // [p * devices + d]
  std::vector<char> ran(tables.params.size(), 0);
  std::vector<double> act_bytes(plan.devices, 0.0);
  Predicted& pred = plan.predicted;
  pred = Predicted{0, 0, 0, 0, pred.relaxed_optimum_ms, std::vector<int64_t>(plan.devices, 0)};
  const int islands = island_count(plan.devices, plan.devices_per_island);
  WaveTraffic traffic;
  for (Wave& wave : plan.waves) {
    wave.ms = 0;
    traffic.intra_bytes.assign(static_cast<size_t>(plan.devices), 0.0);
    traffic.inter_bytes.assign(static_cast<size_t>(islands), 0.0);
    for (const Slice& s : wave.slices) {
      wave.ms = std::max(wave.ms, s.ms);
      const PlanMetaOp& m = plan.metaops[s.metaop];
      const int n = static_cast<int>(s.devices.size());
      const CostTables::MetaOpCost& mc = tables.metaops[static_cast<size_t>(s.metaop)];
      for (int k = s.first; k < s.first + s.count; ++k) {
        const auto p = static_cast<size_t>(mc.param[static_cast<size_t>(k)]);
        ran[p] = 1;
        char* on = runs.data() + p * devices;
        for (int d : s.devices) on[static_cast<size_t>(d)] = 1;
        const double act = activation_bytes(mc.act_bytes_per_sample, m.workload.batch, n);
        for (int d : s.devices) act_bytes[d] += act;
      }
      // Inputs of this slice: the previous slice of the same MetaOp, or the
      // last slices of the input MetaOps.
      if (s.first > 0) {
        const Slice* prev = nullptr;
        for (const Slice* p : slices_of[s.metaop])
          if (p->first + p->count == s.first) prev = p;
        if (prev && prev->devices != s.devices)
          add_reshard(traffic, prev->devices, m.tensor_parallel, s.devices, m.tensor_parallel, m.workload.batch,
                      mc.in_bytes_per_sample[static_cast<size_t>(s.first)], plan.devices_per_island);
      } else {
        for (int in : m.inputs) {
          if (slices_of[in].empty()) continue;
          const Slice* last = slices_of[in].back();
          const PlanMetaOp& im = plan.metaops[in];
          if (last->devices != s.devices)
            add_reshard(traffic, last->devices, im.tensor_parallel, s.devices, m.tensor_parallel, m.workload.batch,
                        tables.metaops[static_cast<size_t>(in)].out_bytes_per_sample, plan.devices_per_island);
        }
      }
    }
    wave.transfer_ms = 2.0 * traffic_ms(traffic, cost);
    pred.compute_ms += wave.ms;
    pred.transfer_ms += wave.transfer_ms;
  }

  // Parameter groups (rule 5), gradient synchronisation and memory
  // (rules/memory.h: the parameter state of every shard a device holds).
  const int dtype = tables.dtype_bytes;
  std::vector<double> sync_ms(plan.devices, 0.0);
  std::vector<double> state_bytes(plan.devices, 0.0);
  add_held_state(held_shards(plan,
                             [&](int m, int k) {
                               return tables.metaops[static_cast<size_t>(m)].param[static_cast<size_t>(k)];
                             }),
                 tables.params, dtype, plan.optimizer_state, state_bytes);
  // Groups are rewritten in place: a plan costed again (the planner's
  // scratch plan) keeps its strings and vectors.
  size_t groups = 0;
  for (size_t p = 0; p < tables.params.size(); ++p) {
    if (!ran[p]) continue;
    const CostTables::Param& param = tables.params[p];
    if (groups == plan.param_groups.size()) plan.param_groups.emplace_back();
    ParamGroup& group = plan.param_groups[groups++];
    if (group.param != param.name) group.param = param.name;
    std::vector<int>& on = group.devices;
    on.clear();
    const char* runs_on = runs.data() + p * devices;
    for (size_t d = 0; d < devices; ++d)
      if (runs_on[d]) on.push_back(static_cast<int>(d));
    const double ms = param.shard_bytes > 0 ? cost.allreduce_ms(param.shard_bytes, on) : 0.0;
    for (int d : on) sync_ms[d] += ms;
  }
  plan.param_groups.resize(groups);
  for (int d = 0; d < plan.devices; ++d) {
    pred.sync_ms = std::max(pred.sync_ms, sync_ms[d]);
    pred.memory_bytes[d] = limits::bytes_to_int64(state_bytes[d] + act_bytes[d]);  // saturates, never wraps
  }
  pred.iteration_ms = pred.compute_ms + pred.transfer_ms + pred.sync_ms;
}

}  // namespace spindle::plan
