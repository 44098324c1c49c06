#include "libplan/planner/feasibility.h"

#include "libplan/cost/analytic.h"
#include "libplan/rules/devices.h"
#include "libplan/rules/memory.h"
#include "libplan/plan/plan.h"
#include "libplan/planner/cost_plan.h"
#include "libplan/lower/lower.h"
#include "libplan/model/ops.h"
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

// cost_plan's memory with no activations: the parameter state of every
// shard a device holds, as spindle-run allocates it (memory_as_run adds
// the activations as spindle-run holds them). No times: cost_plan reads no
// curve for memory, and the transfer and all-reduce figures it computes
// with these are discarded.
class ParamStateOnly : public CostModel {
 public:
  const ScalingCurve* curve(const Workload&) const override { return nullptr; }
  int64_t param_bytes(const Workload&) const override { return 0; }   // the model's, from plan_params
  int64_t activation_bytes_per_sample(const Workload&) const override { return 0; }
  double p2p_ms(double, bool) const override { return 0; }
  double allreduce_ms(double, const std::vector<int>&) const override { return 0; }
  double allgather_ms(double, const std::vector<int>&) const override { return 0; }
};

}  // namespace

Result<std::vector<int64_t>> memory_as_run(const Plan& plan, const Model& model, const OpGraph& graph,
                                           int layer_value_bytes, const LowerContext* given) {
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
  // The parameter state as both backends hold it: values, gradients and
  // AdamW's moments in fp32 whatever the model's dtype (docs/gpu.md,
  // "Precision"), so 8 bytes a value whole and m and v (8) divided over
  // the replicas when sharded: param_state_bytes at fp32. (Counted at a
  // bf16 model's dtype, 4 + 12 / R, a sharded plan came 4 (1 - 1/R) bytes
  // a value short, 11.5 GiB on qwen-val-3 on 32 A800s; replicated both
  // give 16. Found by a review, 2026-12-07.)
  static_assert(kRunParamValueBytes == 4, "the parameter state as run is fp32");
  Model fp32 = model;
  fp32.dtype = DType::fp32;
  Plan costed = plan;
  cost_plan(costed, fp32, graph, ParamStateOnly());
  std::vector<int64_t> mem = std::move(costed.predicted.memory_bytes);
  // The activations, every slice's operators at the rows a device holds:
  // a data-parallel group's share of the batch (tensor-parallel ranks hold
  // the same rows), or the whole batch for an operator that needs it; the
  // replicated part whole and the split part over the TP ranks. All are
  // alive together (every forward before any backward). Plus the backward
  // pass's working set: an operator's backward makes its gradients while
  // what its forward kept is still alive (released after it): a gradient
  // of each kept tensor and temporaries of their order (a LayerNorm's
  // backward makes three of its input's size), counted as twice the
  // largest operator's transients the device runs (RunActivation: what it
  // keeps, but lm_loss's vocabulary-wide gradient is made in place).
  // (Once was not enough: a pool_project of 16 columns made 1152 bytes
  // for 1008 kept, in a random model of the equivalence soak.)
  std::vector<double> held(mem.size(), 0.0), working(mem.size(), 0.0);
  for (const Wave& wave : plan.waves)
    for (const Slice& sl : wave.slices) {
      const PlanMetaOp& m = plan.metaops[static_cast<size_t>(sl.metaop)];
      const RunActivation a = analytic_run_activation(m.workload, layer_value_bytes);
      const auto bytes = [&](double replicated, double split) {
        return run_activation_bytes(replicated, split, m.workload.batch, static_cast<int>(sl.devices.size()),
                                    m.tensor_parallel, op_needs_whole_batch(m.workload.op));
      };
      const double one = bytes(a.replicated, a.split);
      const double transient = bytes(a.transient_replicated, a.transient_split);
      // In the CUDA backend's bf16 mode a transformer layer also keeps a
      // bf16 copy of its weights from its forward to its backward
      // (docs/gpu.md, "Precision"): 2 bytes per value of its shard (the
      // shard's biases and LayerNorms too: an upper bound).
      const double weights =
          layer_value_bytes < kRunActivationValueBytes && m.workload.op == "transformer_layer"
              ? static_cast<double>(layer_value_bytes) *
                    static_cast<double>(op_shard_param_count(m.workload.op, m.workload.dims, m.workload.seq,
                                                             std::max(m.tensor_parallel, 1)))
              : 0.0;
      for (int d : sl.devices) {
        held[static_cast<size_t>(d)] += (one + weights) * sl.count;
        working[static_cast<size_t>(d)] = std::max(working[static_cast<size_t>(d)], transient);
      }
    }
  // The messages: a device's rows for other devices leave from buffers of
  // their own, held until the step's last instruction waits for the sends,
  // and the rows it receives land in buffers held until the slice reads
  // them (the lowered programs' sent and received bytes, an upper bound).
  std::optional<LowerContext> made;
  if (given == nullptr) {
    SPINDLE_ASSIGN(context, lower_context(model, graph));
    made = std::move(context);
  }
  const LowerContext& context = given ? *given : *made;
  LowerOptions options;
  options.deps = false;
  options.runtime_maps = false;
  SPINDLE_ASSIGN(lowered, lower_header(plan, context, options));
  SPINDLE_TRY(lower_programs(plan, context, lowered, options));
  for (size_t d = 0; d < mem.size(); ++d) {
    const ProgramBytes b = lowered.bytes(static_cast<int>(d));
    mem[d] = limits::bytes_to_int64(static_cast<double>(mem[d]) + held[d] + 2.0 * working[d] +
                                    static_cast<double>(b.sent + b.received));
  }
  // The lowering's buckets: with sharded state each all-gather's two
  // buffers (the gathered values and this device's chunk), on every
  // backend, all of them at once (with overlap every bucket's all-gather
  // starts at the program's start and its buffers live until its wait).
  // The gradients are views of each bucket's flat buffer (no copy) on the
  // host and over NCCL; a device backend over MPI stages the buffer in host
  // memory.
  std::vector<double> gather(mem.size(), 0.0);
  for (size_t b = 0; b < lowered.buckets.size(); ++b) {
    const Bucket& k = lowered.buckets[b];
    const double gathered = static_cast<double>(lowered.gather_bytes(static_cast<int>(b)));
    const double chunk = gathered / static_cast<double>(k.devices.size());
    for (int d : k.devices) gather[static_cast<size_t>(d)] += gathered + chunk;
  }
  for (size_t d = 0; d < mem.size(); ++d)   // saturates, never wraps
    mem[d] = limits::bytes_to_int64(static_cast<double>(mem[d]) + gather[d]);
  return mem;
}

Status check_memory_as_run(const Plan& plan, const Model& model, const OpGraph& graph, const std::string& path,
                           int layer_value_bytes, const LowerContext* context) {
  SPINDLE_ASSIGN(mem, memory_as_run(plan, model, graph, layer_value_bytes, context));
  return check_memory_as_run(plan, model, mem, path, layer_value_bytes);
}

Result<std::vector<int64_t>> memory_as_run_on_gpus(const Plan& plan, const Model& model, const OpGraph& graph,
                                                   const LowerContext* context) {
  return memory_as_run(plan, model, graph, kBf16LayerValueBytes, context);
}

bool fits_on_gpus(const Plan& plan, const Model& model, const OpGraph& graph, const LowerContext* context) {
  const auto mem = memory_as_run_on_gpus(plan, model, graph, context);
  return mem && std::all_of(mem->begin(), mem->end(), [&](int64_t b) { return b <= plan.memory_bytes; });
}

std::optional<int64_t> sharding_fits_on_gpus(const Plan& plan, const Model& model, const OpGraph& graph,
                                             std::optional<int64_t> replicated_peak, const LowerContext* context) {
  if (plan.optimizer_state != OptimizerState::replicated) return std::nullopt;
  auto peak = [&](const Plan& p) -> std::optional<int64_t> {
    const auto mem = memory_as_run_on_gpus(p, model, graph, context);
    if (!mem || mem->empty()) return std::nullopt;
    return *std::max_element(mem->begin(), mem->end());
  };
  const std::optional<int64_t> replicated = replicated_peak ? replicated_peak : peak(plan);
  if (!replicated || *replicated <= plan.memory_bytes) return std::nullopt;
  Plan sharded = plan;
  sharded.optimizer_state = OptimizerState::sharded;
  const std::optional<int64_t> with = peak(sharded);
  if (!with || *with > plan.memory_bytes) return std::nullopt;
  return with;
}

Status check_memory_as_run(const Plan& plan, const Model& model, const std::vector<int64_t>& mem,
                           const std::string& path, int layer_value_bytes) {
  const auto worst = std::max_element(mem.begin(), mem.end());
  if (worst == mem.end() || *worst <= plan.memory_bytes) return Status::Ok();
  const auto d = static_cast<size_t>(worst - mem.begin());
  const std::vector<int64_t>& counted = plan.predicted.memory_bytes;
  std::string why = d < counted.size()
                        ? "the plan counts " + size_text(static_cast<double>(counted[d])) + " there"
                        : std::string("the plan counts none there");
  if (dtype_bytes(model.dtype) < kRunActivationValueBytes)
    why += std::string(", with the activations in ") + dtype_name(model.dtype) +
           ", which spindle-run keeps in fp32" +
           (layer_value_bytes < kRunActivationValueBytes ? " (a transformer layer's internals in bf16)" : "") +
           (plan.optimizer_state == OptimizerState::sharded
                ? std::string(", and the parameters and their gradients in ") + dtype_name(model.dtype) +
                      ", which it keeps in fp32 on every replica"
                : std::string());
  why += std::string(dtype_bytes(model.dtype) < kRunActivationValueBytes ? ", and" : ",") +
         " without the attention probabilities, the operators' outputs and the backward pass's working set, which "
         "spindle-run holds too";
  if (plan.optimizer_state == OptimizerState::sharded) why += ", nor each gradient bucket's all-gather buffers";
  // (Smaller gradient buckets hold the same bytes in all: not advised.)
  return Error{path + ": device " + std::to_string(d) + " would hold " + size_text(static_cast<double>(*worst)) +
               " of " + size_text(static_cast<double>(plan.memory_bytes)) + ": " + why + "; plan again on more devices" +
               (plan.optimizer_state == OptimizerState::replicated ? ", or with the optimizer state sharded" : "")};
}

}  // namespace spindle::plan
