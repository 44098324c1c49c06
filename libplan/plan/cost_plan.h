// Costing a placed plan (design.md, step 9): fills wave.transfer_ms,
// param_groups and every field of Plan::predicted except relaxed_optimum_ms.
#pragma once

#include "libplan/cost/cost_model.h"
#include "libplan/graph/op_graph.h"
#include "libplan/model/model.h"
#include "libplan/plan/plan.h"

namespace spindle::plan {

// Bytes per sample of an operator's output activation (pool_project: one
// token; 0 for losses). What moves between waves.
double output_bytes_per_sample(const Operator& op, int dtype_bytes);

// Requires plan.metaops and plan.waves with concrete devices and slice ms.
// Computes: wave.ms (longest slice), param_groups (rule 5), inter-wave
// transfer times, gradient all-reduce time per parameter group, memory per
// device, and the predicted totals.
void cost_plan(Plan& plan, const Model& model, const OpGraph& graph, const CostModel& cost);

}  // namespace spindle::plan
