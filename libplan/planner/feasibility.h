// Checks that a model can be planned on a cluster at all, before planning,
// so the error can name the model file, key and line rather than a MetaOp.
#pragma once

#include <cstdint>
#include <vector>

#include "libplan/cost/cost_model.h"
#include "libplan/graph/op_graph.h"
#include "libplan/model/cluster.h"
#include "libplan/model/model.h"
#include "libplan/util/status.h"

namespace spindle::plan {

// Errors: a module's tensor_parallel larger than the cluster
// (modules.M.tensor_parallel), a task whose batch admits no valid device count
// for one of its modules (tasks[i].batch).
Status check_model_fits_cluster(const Model& model, const Cluster& cluster);

}  // namespace spindle::plan

namespace spindle::plan {

struct Plan;
enum class OptimizerState;

// Rule 6 as a user-facing error: when a device's predicted peak exceeds the
// cluster's memory, names the model file, the device, the bytes needed and
// available, and the MetaOps that run there (largest activations first).
Status check_plan_memory(const Plan& plan, const Model& model);

// `plan`'s predicted memory per device (Predicted::memory_bytes) with its
// optimizer state counted as `state` instead of plan.optimizer_state, by
// the same costing (cost_plan). For a plan made with sharded state: what
// spindle-run, which keeps every replica's state whole, would hold.
std::vector<int64_t> memory_with(const Plan& plan, OptimizerState state, const Model& model, const OpGraph& graph,
                                 const CostModel& cost);

}  // namespace spindle::plan
