#include "libplan/planner/feasibility.h"

#include "libplan/rules/devices.h"
#include "libplan/plan/plan.h"
#include "libplan/planner/cost_plan.h"

#include <algorithm>
#include <cstdio>
#include <set>

namespace spindle::plan {

Status check_model_fits_cluster(const Model& model, const Cluster& cluster) {
  for (const Module& m : model.modules) {
    if (m.tensor_parallel > cluster.devices())
      return make_error({model.path, "modules." + m.name + ".tensor_parallel", m.mark.line, m.mark.column},
                        "tensor_parallel " + std::to_string(m.tensor_parallel) + " is larger than cluster '" +
                            cluster.name + "' (" + std::to_string(cluster.devices()) + " devices)");
  }
  for (size_t t = 0; t < model.tasks.size(); ++t) {
    const Task& task = model.tasks[t];
    for (const Node& node : task.nodes) {
      const Module* m = model.find_module(node.module);
      if (!m || !valid_device_counts(cluster.devices(), m->tensor_parallel, task.batch).empty()) continue;
      return make_error({model.path, "tasks[" + std::to_string(t) + "].batch", task.mark.line, task.mark.column},
                        "batch " + std::to_string(task.batch) + " of task '" + task.name +
                            "' admits no device count for module '" + m->name + "' (tensor_parallel " +
                            std::to_string(m->tensor_parallel) + ") on " + std::to_string(cluster.devices()) +
                            " devices: a slice needs a multiple n of tensor_parallel with n / tensor_parallel "
                            "dividing the batch");
    }
  }
  return Status::Ok();
}

}  // namespace spindle::plan

namespace spindle::plan {

namespace {
std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1ull << 30));
  return buf;
}
}  // namespace

Status check_plan_memory(const Plan& plan, const Model& model) {
  const auto& mem = plan.predicted.memory_bytes;
  int worst = -1;
  for (size_t d = 0; d < mem.size(); ++d)
    if (mem[d] > plan.memory_bytes && (worst < 0 || mem[d] > mem[worst])) worst = static_cast<int>(d);
  if (worst < 0) return Status::Ok();
  int over = 0;
  for (int64_t b : mem) over += b > plan.memory_bytes;
  std::set<std::string> metaops;
  for (const Wave& w : plan.waves)
    for (const Slice& s : w.slices)
      if (std::find(s.devices.begin(), s.devices.end(), worst) != s.devices.end()) {
        const PlanMetaOp& m = plan.metaops[s.metaop];
        metaops.insert(m.task + " " + m.workload.op + " (MetaOp " + std::to_string(m.id) + ")");
      }
  std::string list;
  int shown = 0;
  for (const std::string& m : metaops) {
    if (shown++ == 6) {
      list += ", ...";
      break;
    }
    list += (list.empty() ? "" : ", ") + m;
  }
  return Error{(model.path.empty() ? model.name : model.path) + ": does not fit in device memory on cluster '" +
               plan.cluster_name + "': device " + std::to_string(worst) + " needs " +
               gib(static_cast<double>(mem[worst])) + " of " + gib(static_cast<double>(plan.memory_bytes)) +
               " (" + std::to_string(over) + " of " + std::to_string(plan.devices) +
               " devices over) for parameters, gradients, optimizer state and activations of " + list +
               "; use more devices, smaller task batches, or devices with more memory"};
}

std::vector<int64_t> memory_with(const Plan& plan, OptimizerState state, const Model& model, const OpGraph& graph,
                                 const CostModel& cost) {
  Plan other = plan;
  other.optimizer_state = state;
  cost_plan(other, model, graph, cost);
  return std::move(other.predicted.memory_bytes);
}

}  // namespace spindle::plan
