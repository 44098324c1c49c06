#include "libplan/planner/feasibility.h"

#include "libplan/cost/analytic.h"
#include "libplan/rules/devices.h"
#include "libplan/rules/memory.h"
#include "libplan/plan/plan.h"
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

Result<std::vector<int64_t>> memory_as_run(const Plan& plan, const Model& model, const OpGraph& graph,
                                           bool bucket_copies) {
  std::vector<int64_t> mem = plan.predicted.memory_bytes;
  if (mem.size() != static_cast<size_t>(plan.devices))
    return Error{"plan: predicted.memory_bytes has " + std::to_string(mem.size()) + " devices, the plan " +
                 std::to_string(plan.devices)};
  // The activations as spindle-run keeps them (kRunActivationValueBytes),
  // where the plan counts them in a narrower model dtype: the difference
  // for each operator a device runs, by the analytic count of kept bytes
  // (the plan's count, from its profile, is not in it).
  std::vector<double> wider(mem.size(), 0.0);
  if (dtype_bytes(model.dtype) < kRunActivationValueBytes)
    for (const Wave& wave : plan.waves)
      for (const Slice& s : wave.slices) {
        const Workload& w = plan.metaops[static_cast<size_t>(s.metaop)].workload;
        const double per_sample = static_cast<double>(analytic_activation_bytes_per_sample(w, DType::fp32) -
                                                      analytic_activation_bytes_per_sample(w, model.dtype));
        const double bytes =
            s.count * activation_bytes(per_sample, w.batch, static_cast<int>(s.devices.size()));
        for (int d : s.devices) wider[static_cast<size_t>(d)] += bytes;
      }
  for (size_t d = 0; d < mem.size(); ++d)   // saturates, never wraps
    mem[d] = limits::bytes_to_int64(static_cast<double>(mem[d]) + wider[d]);
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
  std::string why = "the plan counts " + size_text(static_cast<double>(plan.predicted.memory_bytes[d])) + " there";
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
