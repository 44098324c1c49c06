// Checks that a model can be planned on a cluster at all, before planning,
// so the error can name the model file, key and line rather than a MetaOp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// Rule 6 as a user-facing error: when a device's predicted peak exceeds the
// cluster's memory, names the model file, the device, the bytes needed and
// available, and the MetaOps that run there (largest activations first).
Status check_plan_memory(const Plan& plan, const Model& model);

// What spindle-run, which keeps the optimizer state whole on every replica,
// holds per device for `plan` (model `model`, expanded as `graph`), from
// the plan's own figures, without a cost model: its memory_bytes, plus,
// when it counts the state sharded, the rest of the state of every
// tensor-parallel shard the device holds (held_shards, cost_plan.h: each
// shard over the holders of its parameter and rank, as cost_plan counts
// it; op_shard_values, rules/memory.h), plus, with `bucket_copies` (a
// device backend over NCCL), each gradient bucket's flat buffer on each of
// its holders (the lowering's buckets: lower_header;
// kBucketCopyBytesPerValue). Without bucket_copies it equals the costing
// of the plan with its state counted replicated (cost_plan) to within
// rounding (tested). What spindle-plan summarises, spindle-plan --check
// and spindle-run check.
Result<std::vector<int64_t>> memory_as_run(const Plan& plan, const Model& model, const OpGraph& graph,
                                           bool bucket_copies = false);
// An error when a device of `plan` (read from `path`) would hold more than
// its memory_bytes as spindle-run runs it (memory_as_run): names the path,
// the device, both figures and what to do.
Status check_memory_as_run(const Plan& plan, const Model& model, const OpGraph& graph, const std::string& path,
                           bool bucket_copies = false);

}  // namespace spindle::plan
