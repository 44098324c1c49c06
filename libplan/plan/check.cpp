#include "libplan/plan/check.h"

#include "libplan/rules/devices.h"
#include "libplan/util/units.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace spindle::plan {

namespace {

std::string list(const std::vector<int>& v) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << "]";
  return s.str();
}

// Consistency of the MetaOps with the model's operator graph. Returns false
// when the MetaOps are too broken for the wave rules to be checked.
bool check_metaops(const Plan& plan, const Model& model, const OpGraph& graph, std::vector<std::string>& out) {
  std::map<std::string, int> op_index;
  for (size_t i = 0; i < graph.ops.size(); ++i) op_index[graph.ops[i].id] = static_cast<int>(i);

  std::vector<int> owner(graph.ops.size(), -1);  // operator -> metaop
  bool usable = true;
  for (size_t id = 0; id < plan.metaops.size(); ++id) {
    const PlanMetaOp& m = plan.metaops[id];
    std::string where = "metaops[" + std::to_string(id) + "]";
    if (m.id != static_cast<int>(id)) {
      out.push_back(where + ": id " + std::to_string(m.id) + " differs from its position " + std::to_string(id));
      usable = false;
    }
    if (m.operators.empty()) {
      out.push_back(where + ": no operators");
      usable = false;
      continue;
    }
    bool tp_said = false;
    for (size_t k = 0; k < m.operators.size(); ++k) {
      auto it = op_index.find(m.operators[k]);
      if (it == op_index.end()) {
        out.push_back(where + ".operators[" + std::to_string(k) + "]: '" + m.operators[k] +
                      "' is not an operator of model '" + model.name + "' (plan for another model?)");
        usable = false;
        continue;
      }
      int o = it->second;
      if (owner[o] >= 0) {
        out.push_back(where + ": operator '" + m.operators[k] + "' also belongs to MetaOp " + std::to_string(owner[o]));
        usable = false;
      }
      owner[o] = static_cast<int>(id);
      const Operator& op = graph.ops[o];
      if (!(op.workload == m.workload))
        out.push_back(where + ": operator '" + op.id + "' has workload " + op.workload.key() +
                      ", the MetaOp says " + m.workload.key());
      if (model.tasks[op.task].name != m.task)
        out.push_back(where + ": operator '" + op.id + "' belongs to task '" + model.tasks[op.task].name +
                      "', the MetaOp says '" + m.task + "'");
      if (op.tensor_parallel != m.tensor_parallel && !tp_said) {   // once a MetaOp: its operators share a module
        tp_said = true;
        out.push_back(where + ": tensor_parallel " + std::to_string(m.tensor_parallel) +
                      (m.tensor_parallel == 1 ? " (1 when the key is absent)" : "") + " but the module of '" + op.id +
                      "' has " + std::to_string(op.tensor_parallel));
      }
      if (k > 0) {
        auto prev = op_index.find(m.operators[k - 1]);
        if (prev != op_index.end()) {
          const Operator& p = graph.ops[prev->second];
          if (p.outputs != std::vector<int>{o} || op.inputs != std::vector<int>{prev->second})
            out.push_back(where + ": '" + p.id + "' -> '" + op.id + "' is not a single-edge chain link");
        }
      }
    }
  }
  for (size_t o = 0; o < graph.ops.size(); ++o) {
    if (owner[o] < 0) {
      out.push_back("metaops: operator '" + graph.ops[o].id + "' of the model is in no MetaOp");
      usable = false;
    }
  }
  if (!usable) return false;

  // Inputs and levels.
  bool inputs_right = true;
  std::vector<char> level_said(plan.metaops.size(), 0);
  for (const PlanMetaOp& m : plan.metaops) {
    std::set<int> expected;
    const Operator& first = graph.ops[op_index[m.operators.front()]];
    for (int in : first.inputs) expected.insert(owner[in]);
    std::vector<int> want(expected.begin(), expected.end());
    std::vector<int> have = m.inputs;
    std::sort(have.begin(), have.end());
    std::string where = "metaops[" + std::to_string(m.id) + "]";
    if (want != have) {
      out.push_back(where + ".inputs: expected " + list(want) + ", found " + list(m.inputs));
      inputs_right = false;
    }
    for (int in : m.inputs) {
      if (in < 0 || in >= static_cast<int>(plan.metaops.size())) continue;
      if (plan.metaops[in].level >= m.level && !level_said[static_cast<size_t>(m.id)]) {
        out.push_back(where + ".level: " + std::to_string(m.level) + " is not greater than the level " +
                      std::to_string(plan.metaops[in].level) + " of input MetaOp " + std::to_string(in));
        level_said[static_cast<size_t>(m.id)] = 1;
      }
    }
  }
  // Each level is the MetaOp's MetaLevel: the longest path to it from a
  // MetaOp without inputs (0 there; docs/planner.md, step 2). With the
  // inputs right they follow the model's operators, which hold no cycle.
  if (inputs_right) {
    std::vector<int> depth(plan.metaops.size(), -1);
    const std::function<int(int)> level_of = [&](int i) {
      int& d = depth[static_cast<size_t>(i)];
      if (d >= 0) return d;
      int longest = 0;
      for (int in : plan.metaops[static_cast<size_t>(i)].inputs) longest = std::max(longest, level_of(in) + 1);
      return d = longest;
    };
    for (const PlanMetaOp& m : plan.metaops)
      if (!level_said[static_cast<size_t>(m.id)] && m.level != level_of(m.id))
        out.push_back("metaops[" + std::to_string(m.id) + "].level: " + std::to_string(m.level) +
                      ", but its MetaLevel (the longest path to it from a MetaOp without inputs) is " +
                      std::to_string(level_of(m.id)));
  }
  return true;
}

// Every time and byte figure of the plan is a finite number >= 0 (the
// readers' bounds keep the planner's sums finite; docs/hardening.md).
void check_figures(const Plan& plan, std::vector<std::string>& out) {
  auto figure = [&](double v, const std::string& where) {
    if (!std::isfinite(v) || v < 0) out.push_back(where + ": " + std::to_string(v) + " is not a finite number >= 0");
  };
  for (size_t w = 0; w < plan.waves.size(); ++w) {
    const std::string wh = "waves[" + std::to_string(w) + "]";
    figure(plan.waves[w].ms, wh + ".ms");
    figure(plan.waves[w].transfer_ms, wh + ".transfer_ms");
    for (size_t s = 0; s < plan.waves[w].slices.size(); ++s)
      figure(plan.waves[w].slices[s].ms, wh + ".slices[" + std::to_string(s) + "].ms");
  }
  const Predicted& q = plan.predicted;
  figure(q.iteration_ms, "predicted.iteration_ms");
  figure(q.compute_ms, "predicted.compute_ms");
  figure(q.transfer_ms, "predicted.transfer_ms");
  figure(q.sync_ms, "predicted.sync_ms");
  figure(q.relaxed_optimum_ms, "predicted.relaxed_optimum_ms");
  for (size_t d = 0; d < q.memory_bytes.size(); ++d)
    if (q.memory_bytes[d] < 0)
      out.push_back("predicted.memory_bytes[" + std::to_string(d) + "]: " + std::to_string(q.memory_bytes[d]) +
                    " is negative");
  if (plan.memory_bytes < 1) out.push_back("cluster.memory_bytes: " + std::to_string(plan.memory_bytes) + " is not positive");
}

}  // namespace

std::vector<std::string> check_plan_cluster(const Plan& plan, const Cluster& cluster) {
  std::vector<std::string> out;
  if (plan.devices != cluster.devices())
    out.push_back("cluster.devices: the plan is for " + std::to_string(plan.devices) + " devices, cluster '" +
                  cluster.name + "' has " + std::to_string(cluster.devices()));
  if (plan.devices_per_island != cluster.devices_per_island)
    out.push_back("cluster.devices_per_island: the plan has " + std::to_string(plan.devices_per_island) +
                  " devices per island, cluster '" + cluster.name + "' has " +
                  std::to_string(cluster.devices_per_island));
  if (plan.memory_bytes != cluster.memory_bytes())
    out.push_back("cluster.memory_bytes: the plan assumes " + std::to_string(plan.memory_bytes) +
                  " bytes per device, cluster '" + cluster.name + "' has " + std::to_string(cluster.memory_bytes()));
  if (plan.cluster_name != cluster.name)
    out.push_back("cluster.name: the plan is for '" + plan.cluster_name + "', the cluster is '" + cluster.name + "'");
  return out;
}

namespace {

// What check_waves gathers for the rules checked after it.
struct SliceIndex {
  // Per parameter: the devices of every slice that runs one of its operators.
  std::map<std::string, std::set<int>> param_devices;
};

// Every wave and slice: indices, operator ranges, each wave's ms at least
// its longest slice's, rule 4 (valid device counts). The plan's MetaOps
// name the graph's operators (check_metaops).
SliceIndex check_waves(const Plan& plan, const OpGraph& graph, std::vector<std::string>& out) {
  const int nm = static_cast<int>(plan.metaops.size());
  SliceIndex index;
  std::map<std::string, int> op_index;
  for (size_t i = 0; i < graph.ops.size(); ++i) op_index[graph.ops[i].id] = static_cast<int>(i);
  for (size_t w = 0; w < plan.waves.size(); ++w) {
    const Wave& wave = plan.waves[w];
    std::string wh = "waves[" + std::to_string(w) + "]";
    if (wave.index != static_cast<int>(w))
      out.push_back(wh + ".index: " + std::to_string(wave.index) + " differs from its position");
    if (wave.slices.empty()) out.push_back(wh + ": a wave without slices");
    double longest = 0;
    for (size_t s = 0; s < wave.slices.size(); ++s) {
      const Slice& sl = wave.slices[s];
      std::string sh = wh + ".slices[" + std::to_string(s) + "]";
      if (sl.metaop < 0 || sl.metaop >= nm) {
        out.push_back(sh + ".metaop: " + std::to_string(sl.metaop) + " is not a MetaOp id");
        continue;
      }
      const PlanMetaOp& m = plan.metaops[sl.metaop];
      longest = std::max(longest, sl.ms);
      if (sl.count < 1 || sl.first < 0 || sl.first + sl.count > static_cast<int>(m.operators.size()))
        out.push_back(sh + ": operators " + std::to_string(sl.first) + ".." + std::to_string(sl.first + sl.count - 1) +
                      " outside MetaOp " + std::to_string(sl.metaop) + " (" + std::to_string(m.operators.size()) +
                      " operators)");
      // Rule 4.
      const int n = static_cast<int>(sl.devices.size());
      if (n > 0 && !valid_device_count(n, m.tensor_parallel, m.workload.batch))
        out.push_back("rule 4: " + sh + ": " + std::to_string(n) + " devices for MetaOp " +
                      std::to_string(sl.metaop) + " (batch " + std::to_string(m.workload.batch) +
                      ", tensor_parallel " + std::to_string(m.tensor_parallel) + ")");
      // Parameters run by this slice (rule 5).
      if (sl.first >= 0 && sl.first + sl.count <= static_cast<int>(m.operators.size()))
        for (int k = sl.first; k < sl.first + sl.count; ++k)
          index.param_devices[graph.ops[op_index[m.operators[k]]].param].insert(sl.devices.begin(), sl.devices.end());
    }
    if (wave.ms + 1e-3 < longest)
      out.push_back(wh + ".ms: " + number_text(wave.ms) + " is shorter than its longest slice " +
                    number_text(longest));
  }
  return index;
}

// Rule 5: one parameter group per parameter, over exactly the devices of
// the slices that run it.
void check_param_groups(const Plan& plan, const SliceIndex& index, std::vector<std::string>& out) {
  std::set<std::string> seen;
  for (size_t g = 0; g < plan.param_groups.size(); ++g) {
    const ParamGroup& pg = plan.param_groups[g];
    std::string gh = "param_groups[" + std::to_string(g) + "]";
    if (!seen.insert(pg.param).second) out.push_back("rule 5: " + gh + ": parameter '" + pg.param + "' listed twice");
    auto it = index.param_devices.find(pg.param);
    if (it == index.param_devices.end()) {
      out.push_back("rule 5: " + gh + ": parameter '" + pg.param + "' is run by no slice");
      continue;
    }
    std::vector<int> want(it->second.begin(), it->second.end());
    std::vector<int> have = pg.devices;
    std::sort(have.begin(), have.end());
    if (want != have)
      out.push_back("rule 5: " + gh + " ('" + pg.param + "'): devices " + list(pg.devices) + ", the slices use " +
                    list(want));
  }
  for (const auto& [param, _] : index.param_devices)
    if (!seen.count(param)) out.push_back("rule 5: parameter '" + param + "' has no param_groups entry");
}

// Rule 6: every device's predicted memory fits it.
void check_memory(const Plan& plan, std::vector<std::string>& out) {
  const auto& mem = plan.predicted.memory_bytes;
  if (static_cast<int>(mem.size()) != plan.devices)
    out.push_back("predicted.memory_bytes: " + std::to_string(mem.size()) + " entries for " +
                  std::to_string(plan.devices) + " devices");
  for (size_t d = 0; d < mem.size(); ++d)
    if (mem[d] > plan.memory_bytes)
      out.push_back("rule 6: device " + std::to_string(d) + " needs " + std::to_string(mem[d]) + " bytes, more than " +
                    std::to_string(plan.memory_bytes));
}

}  // namespace

std::vector<std::string> check_wave_order(const Plan& plan) {
  std::vector<std::string> out;
  const int nm = static_cast<int>(plan.metaops.size());
  // Per MetaOp: (wave, first, count) of each slice in wave order; slices
  // naming no MetaOp or operators outside theirs are check_waves' to report.
  std::vector<std::vector<std::tuple<int, int, int>>> slices_of(static_cast<size_t>(std::max(nm, 0)));
  std::vector<char> used(static_cast<size_t>(std::max(plan.devices, 0)), 0);
  for (size_t w = 0; w < plan.waves.size(); ++w) {
    // Names for the messages, made only for one (the planner calls this for
    // every wave swap it tries).
    auto wh = [w] { return "waves[" + std::to_string(w) + "]"; };
    std::fill(used.begin(), used.end(), 0);
    for (size_t s = 0; s < plan.waves[w].slices.size(); ++s) {
      const Slice& sl = plan.waves[w].slices[s];
      auto sh = [&] { return wh() + ".slices[" + std::to_string(s) + "]"; };
      // Rule 3.
      if (sl.devices.empty()) out.push_back(sh() + ".devices: empty");
      for (int d : sl.devices) {
        if (d < 0 || d >= plan.devices)
          out.push_back("rule 3: " + sh() + ": device " + std::to_string(d) + " outside 0.." +
                        std::to_string(plan.devices - 1));
        else if (used[static_cast<size_t>(d)]++)
          out.push_back("rule 3: " + wh() + ": device " + std::to_string(d) + " runs two slices");
      }
      const bool ascending = std::adjacent_find(sl.devices.begin(), sl.devices.end(), std::greater_equal<int>()) ==
                             sl.devices.end();   // the format's order: no copy needed to see no repeat
      if (!ascending && std::set<int>(sl.devices.begin(), sl.devices.end()).size() != sl.devices.size())
        out.push_back("rule 3: " + sh() + ".devices: a device listed twice");
      if (sl.metaop < 0 || sl.metaop >= nm) continue;
      const PlanMetaOp& m = plan.metaops[static_cast<size_t>(sl.metaop)];
      if (sl.count >= 1 && sl.first >= 0 && sl.first + sl.count <= static_cast<int>(m.operators.size()))
        slices_of[static_cast<size_t>(sl.metaop)].emplace_back(static_cast<int>(w), sl.first, sl.count);
    }
  }
  // Rules 1 (each MetaOp's slices cover its operators in order, one per
  // wave) and 2 (a MetaOp starts after its inputs end).
  std::vector<int> first_wave(static_cast<size_t>(std::max(nm, 0)), -1), last_wave(first_wave);
  for (int m = 0; m < nm; ++m) {
    const auto& slices = slices_of[static_cast<size_t>(m)];
    int next = 0, prev_wave = -1;
    for (auto [w, first, count] : slices) {
      if (first != next)
        out.push_back("rule 1: MetaOp " + std::to_string(m) + ": slice in wave " + std::to_string(w) +
                      " starts at operator " + std::to_string(first) + ", expected " + std::to_string(next));
      if (w == prev_wave)
        out.push_back("rule 1: MetaOp " + std::to_string(m) + ": two slices in wave " + std::to_string(w));
      next = first + count;
      prev_wave = w;
    }
    if (next != static_cast<int>(plan.metaops[static_cast<size_t>(m)].operators.size()))
      out.push_back("rule 1: MetaOp " + std::to_string(m) + ": slices cover " + std::to_string(next) + " of its " +
                    std::to_string(plan.metaops[static_cast<size_t>(m)].operators.size()) + " operators");
    if (!slices.empty()) {
      first_wave[static_cast<size_t>(m)] = std::get<0>(slices.front());
      last_wave[static_cast<size_t>(m)] = std::get<0>(slices.back());
    }
  }
  for (int m = 0; m < nm; ++m)
    for (int in : plan.metaops[static_cast<size_t>(m)].inputs)
      if (in >= 0 && in < nm && first_wave[static_cast<size_t>(m)] >= 0 && last_wave[static_cast<size_t>(in)] >= 0 &&
          first_wave[static_cast<size_t>(m)] <= last_wave[static_cast<size_t>(in)])
        out.push_back("rule 2: MetaOp " + std::to_string(m) + " starts in wave " +
                      std::to_string(first_wave[static_cast<size_t>(m)]) + ", not after its input MetaOp " +
                      std::to_string(in) + " ends in wave " + std::to_string(last_wave[static_cast<size_t>(in)]));
  return out;
}

std::vector<std::string> check_plan(const Plan& plan, const Model& model, const OpGraph& graph) {
  std::vector<std::string> out;
  check_figures(plan, out);
  if (!plan.model_sha256.empty() && !model.sha256.empty() && plan.model_sha256 != model.sha256)
    out.push_back("model.sha256: the plan was made for another version of the model file (plan " +
                  plan.model_sha256.substr(0, 12) + "..., model " + model.sha256.substr(0, 12) +
                  "...; any edit counts, a comment too: plan it again with spindle-plan)");
  if (plan.model_name != model.name)
    out.push_back("model.name: the plan is for '" + plan.model_name + "', the model is '" + model.name + "'");
  if (plan.devices < 1) {
    out.push_back("cluster.devices: expected at least 1");
    return out;
  }
  if (!check_metaops(plan, model, graph, out)) return out;
  const SliceIndex index = check_waves(plan, graph, out);
  const std::vector<std::string> order = check_wave_order(plan);
  out.insert(out.end(), order.begin(), order.end());
  check_param_groups(plan, index, out);
  check_memory(plan, out);
  return out;
}

Status check_plan_status(const Plan& plan, const Model& model, const OpGraph& graph, const std::string& plan_path,
                         const Cluster* cluster) {
  std::vector<std::string> v = check_plan(plan, model, graph);
  if (cluster != nullptr) {
    std::vector<std::string> c = check_plan_cluster(plan, *cluster);
    v.insert(v.begin(), c.begin(), c.end());
  }
  if (v.empty()) return Status::Ok();
  std::string msg = plan_path + ": invalid plan (" + std::to_string(v.size()) + " violation" +
                    (v.size() == 1 ? "" : "s") + "):";
  for (size_t i = 0; i < v.size() && i < 8; ++i) msg += "\n  " + v[i];
  if (v.size() > 8) msg += "\n  ... and " + std::to_string(v.size() - 8) + " more";
  return Error{msg};
}

}  // namespace spindle::plan
