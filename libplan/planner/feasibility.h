// Checks that a model can be planned on a cluster at all, before planning,
// so the error can name the model file, key and line rather than a MetaOp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "libplan/graph/op_graph.h"
#include "libplan/model/cluster.h"
#include "libplan/model/model.h"
#include "libplan/rules/memory.h"
#include "libplan/util/status.h"

namespace spindle::plan {

// Errors: a module's tensor_parallel larger than the cluster
// (modules.M.tensor_parallel), a task whose batch admits no valid device count
// for one of its modules (tasks[i].batch).
Status check_model_fits_cluster(const Model& model, const Cluster& cluster);

}  // namespace spindle::plan

namespace spindle::plan {

struct Plan;
struct LowerContext;

// Rule 6 as a user-facing error: when a device's predicted peak exceeds the
// cluster's memory, names the model file, the device, the bytes needed and
// available, and the MetaOps that run there (largest activations first).
Status check_plan_memory(const Plan& plan, const Model& model);

// What spindle-run holds per device for `plan` (model `model`, expanded
// as `graph`), costed again from the model, not read from the plan's own
// figures (a plan edited by hand may count what it likes), and without a
// profile: the parameter state of every shard a device holds (as the plan
// holds it: whole on every replica, or sharded over them, ZeRO-1), every
// operator's activations as spindle-run holds them whatever the model's
// dtype (analytic_run_activation: fp32, the transformer layers' internals
// `layer_value_bytes` wide, the attention probabilities and the outputs
// included; a tensor-parallel rank holding the replicated part whole), the
// backward pass's working set (the largest operator the device runs,
// twice more), the message buffers (the bytes it sends and receives in a
// step) and, with sharded state, the buffers of every all-gather of the
// device's buckets (each bucket's gathered values and its own chunk,
// Lowered::gather_bytes: with overlap all are in flight at once). The
// gradients are their buckets' flat buffers on every backend whose
// all-reduce runs in its own memory (the CPU backend, and a device backend
// over NCCL: Executor::bind_bucket_views), so no second copy of them.
// What spindle-run checks before it allocates, and spindle-plan reports
// (`run mem`, --check). An upper bound of what the CPU backend holds at
// its peak (StepCounters::peak_bytes; the equivalence runs check it).
// `context`: lower_context(model, graph) when the caller has it (the
// planner), else made here.
Result<std::vector<int64_t>> memory_as_run(const Plan& plan, const Model& model, const OpGraph& graph,
                                           int layer_value_bytes = kRunActivationValueBytes,
                                           const LowerContext* context = nullptr);
// memory_as_run as spindle-run holds `plan` on GPUs: the CUDA backend over
// NCCL in its default bf16 mode (a transformer layer's internals kBf16LayerValueBytes wide). The
// figure spindle-plan reports for GPUs, --compare marks and auto asks.
Result<std::vector<int64_t>> memory_as_run_on_gpus(const Plan& plan, const Model& model, const OpGraph& graph,
                                                   const LowerContext* context = nullptr);
// Whether every device of `plan` holds at most its memory_bytes by
// memory_as_run_on_gpus (false when it cannot be worked out).
bool fits_on_gpus(const Plan& plan, const Model& model, const OpGraph& graph, const LowerContext* context = nullptr);

// An error when a device of `plan` (read from `path`) would hold more than
// its memory_bytes as spindle-run runs it (memory_as_run): names the path,
// the device, both figures and what to do.
Status check_memory_as_run(const Plan& plan, const Model& model, const OpGraph& graph, const std::string& path,
                           int layer_value_bytes = kRunActivationValueBytes, const LowerContext* context = nullptr);
// The same on figures memory_as_run gave with that width (a caller that
// keeps them: spindle-run reports its peaks against them).
Status check_memory_as_run(const Plan& plan, const Model& model, const std::vector<int64_t>& mem,
                           const std::string& path, int layer_value_bytes);

// When sharding AdamW's state is what would let `plan` run on GPUs: the
// plan holds the state replicated, is over its devices' memory as
// spindle-run holds it on GPUs over NCCL (memory_as_run with bf16 layer
// internals), and the same waves with the state
// sharded (ZeRO-1) are not. Then the largest device's bytes sharded;
// otherwise nullopt (it fits, holds the state sharded already, or is over
// either way: then its activations, not the state, are too large).
// `--optimizer-state auto` plans such a plan sharded; spindle-plan names
// the flag for a plan made replicated. `replicated_peak`: the plan's own
// largest figure on GPUs when the caller has it; `context` as
// memory_as_run's. A figure that cannot be worked out gives nullopt
// (spindle-run's own check then reports why).
std::optional<int64_t> sharding_fits_on_gpus(const Plan& plan, const Model& model, const OpGraph& graph,
                                             std::optional<int64_t> replicated_peak = std::nullopt,
                                             const LowerContext* context = nullptr);

}  // namespace spindle::plan
