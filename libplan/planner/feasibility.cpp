#include "libplan/planner/feasibility.h"

#include "libplan/cost/analytic.h"
#include "libplan/rules/devices.h"
#include "libplan/rules/memory.h"
#include "libplan/plan/plan.h"
#include "libplan/planner/cost_plan.h"
#include "libplan/lower/lower.h"
#include "libplan/util/limits.h"
#include "libplan/util/units.h"

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
std::string size_text(double bytes) { return human_bytes(bytes, 2); }
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
               size_text(static_cast<double>(mem[worst])) + " of " + size_text(static_cast<double>(plan.memory_bytes)) +
               " (" + std::to_string(over) + " of " + std::to_string(plan.devices) +
               " devices over) for parameters, gradients, optimizer state and activations of " + list +
               "; use more devices, smaller task batches, or devices with more memory"};
}

namespace {

// The sizes spindle-run allocates by, for cost_plan's memory: each
// operator's kept activations by the analytic count with its values in
// fp32 (kRunActivationValueBytes), whatever the model's dtype. No times:
// cost_plan reads no curve for memory, and the transfer and all-reduce
// figures it computes with these are discarded.
class RunSizes : public CostModel {
 public:
  const ScalingCurve* curve(const Workload&) const override { return nullptr; }
  int64_t param_bytes(const Workload&) const override { return 0; }   // the model's, from plan_params
  int64_t activation_bytes_per_sample(const Workload& w) const override {
    static_assert(kRunActivationValueBytes == 4, "the analytic count in fp32");
    return analytic_activation_bytes_per_sample(w, DType::fp32);
  }
  double p2p_ms(double, bool) const override { return 0; }
  double allreduce_ms(double, const std::vector<int>&) const override { return 0; }
  double allgather_ms(double, const std::vector<int>&) const override { return 0; }
};

}  // namespace

Result<std::vector<int64_t>> memory_as_run(const Plan& plan, const Model& model, const OpGraph& graph,
                                           bool bucket_copies) {
  // Costed again from the model, not read from the plan's own figures (a
  // plan edited by hand, or made from a profile with other sizes, says
  // what it likes there): the parameter state of every shard a device
  // holds, and the activations as spindle-run keeps them.
  for (const Wave& wave : plan.waves)
    for (const Slice& sl : wave.slices)
      for (int d : sl.devices)
        if (d < 0 || d >= plan.devices)
          return Error{"plan: a slice on device " + std::to_string(d) + ", the plan has " +
                       std::to_string(plan.devices)};   // check_plan refuses it first
  Plan costed = plan;
  cost_plan(costed, model, graph, RunSizes());
  std::vector<int64_t> mem = std::move(costed.predicted.memory_bytes);
  if (!bucket_copies) return mem;
  // The lowering's buckets: each one's flat buffer on each of its holders,
  // and with sharded state the largest all-gather's two buffers (the
  // gathered values and this device's chunk), which live for the call.
  SPINDLE_ASSIGN(context, lower_context(model, graph));
  LowerOptions header;
  header.deps = false;
  header.runtime_maps = false;
  SPINDLE_ASSIGN(lowered, lower_header(plan, context, header));
  std::vector<double> extra(mem.size(), 0.0), gather(mem.size(), 0.0);
  for (size_t b = 0; b < lowered.buckets.size(); ++b) {
    const Bucket& k = lowered.buckets[b];
    const double gathered = static_cast<double>(lowered.gather_bytes(static_cast<int>(b)));
    const double chunk = gathered / static_cast<double>(k.devices.size());
    for (int d : k.devices) {
      extra[static_cast<size_t>(d)] += static_cast<double>(k.values) * kBucketCopyBytesPerValue;
      gather[static_cast<size_t>(d)] = std::max(gather[static_cast<size_t>(d)], gathered + chunk);
    }
  }
  for (size_t d = 0; d < mem.size(); ++d)   // saturates, never wraps
    mem[d] = limits::bytes_to_int64(static_cast<double>(mem[d]) + extra[d] + gather[d]);
  return mem;
}

Status check_memory_as_run(const Plan& plan, const Model& model, const OpGraph& graph, const std::string& path,
                           bool bucket_copies) {
  SPINDLE_ASSIGN(mem, memory_as_run(plan, model, graph, bucket_copies));
  const auto worst = std::max_element(mem.begin(), mem.end());
  if (worst == mem.end() || *worst <= plan.memory_bytes) return Status::Ok();
  const auto d = static_cast<size_t>(worst - mem.begin());
  const std::vector<int64_t>& counted = plan.predicted.memory_bytes;
  std::string why = d < counted.size()
                        ? "the plan counts " + size_text(static_cast<double>(counted[d])) + " there"
                        : std::string("the plan counts none there");
  if (dtype_bytes(model.dtype) < kRunActivationValueBytes)
    why += std::string(", with the activations in ") + dtype_name(model.dtype) +
           ", which spindle-run keeps in fp32";
  if (bucket_copies)
    why += ", and each gradient bucket's flat buffer in device memory (NCCL) adds 4 bytes per value" +
           std::string(plan.optimizer_state == OptimizerState::sharded ? " (its all-gather's buffers more)" : "");
  return Error{path + ": device " + std::to_string(d) + " would hold " + size_text(static_cast<double>(*worst)) +
               " of " + size_text(static_cast<double>(plan.memory_bytes)) + ": " + why + "; plan again on more devices" +
               (bucket_copies ? " or with smaller gradient buckets (--bucket-mb)" : "")};
}

}  // namespace spindle::plan
