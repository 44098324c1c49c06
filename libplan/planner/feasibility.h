// Checks that a model can be planned on a cluster at all, before planning,
// so the error can name the model file, key and line rather than a MetaOp.
#pragma once

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

// Rule 6 as a user-facing error: when a device's predicted peak exceeds the
// cluster's memory, names the model file, the device, the bytes needed and
// available, and the MetaOps that run there (largest activations first).
Status check_plan_memory(const Plan& plan, const Model& model);

}  // namespace spindle::plan
