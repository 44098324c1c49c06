// Wave-barrier costing of a placed plan (docs/planner.md, step 9): fills
// wave.transfer_ms, param_groups and every field of Plan::predicted except
// relaxed_optimum_ms and simulated_ms (the planner's objective, libplan/sim),
// resetting simulated_ms to 0.
#pragma once

#include <string>
#include <vector>

#include "libplan/cost/cost_model.h"
#include "libplan/graph/op_graph.h"
#include "libplan/model/model.h"
#include "libplan/plan/plan.h"

namespace spindle::plan {

// Bytes per sample of an operator's output activation (pool_project: one
// token; 0 for losses). What moves between waves.
double output_bytes_per_sample(const Operator& op, int dtype_bytes);

// Parameter values one tensor-parallel rank holds for operator `op` of
// `model`: op_shard_param_count with its module's max_seq, as the runtime
// allocates them and the lowering sums them (Bucket::values). What memory
// (x the dtype's bytes) and the gradient all-reduce (x the wire's) count.
int64_t op_shard_values(const Operator& op, const Model& model);

// What costing looks up that depends on the MetaOps, the model, the graph
// and the cost model but not on the waves: built once by cost_tables and
// reused for every candidate plan of the same MetaOps (the planner costs
// many). Plain data; valid while plan.metaops is unchanged.
struct CostTables {
  int dtype_bytes = 2;
  struct MetaOpCost {
    // Per operator position: its parameter (index into `params`) and the
    // output bytes per sample of the operator feeding it (its first graph
    // input; 0 for position 0, whose inputs are other MetaOps).
    std::vector<int> param;
    std::vector<double> in_bytes_per_sample;
    double act_bytes_per_sample = 0;   // kept for backward, one operator
    double out_bytes_per_sample = 0;   // leaving its last operator
  };
  std::vector<MetaOpCost> metaops;     // by MetaOp id (index of plan.metaops)
  struct Param {
    std::string name;                  // "M/k.r"
    double shard_bytes = 0;            // one tensor-parallel shard, model dtype
    int tensor_parallel = 1;
  };
  std::vector<Param> params;           // every parameter the MetaOps run, by name
};

// Requires plan.metaops whose operators are ids of `graph`.
CostTables cost_tables(const Plan& plan, const Model& model, const OpGraph& graph, const CostModel& cost);

// Requires plan.metaops and plan.waves with concrete devices and slice ms.
// Computes: wave.ms (longest slice), param_groups (rule 5), inter-wave
// transfer times, gradient all-reduce time per parameter group, memory per
// device, and the predicted totals.
void cost_plan(Plan& plan, const Model& model, const OpGraph& graph, const CostModel& cost);
// The same with tables built by cost_tables for these plan.metaops: the
// same results, bit for bit.
void cost_plan(Plan& plan, const CostTables& tables, const CostModel& cost);

}  // namespace spindle::plan
