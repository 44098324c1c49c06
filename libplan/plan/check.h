// The plan checker: every rule of spec/plan.md, plus consistency with the
// model it claims to plan. Used by the tests, by spindle-plan before it
// writes, and by `spindle-plan --check`.
#pragma once

#include <string>
#include <vector>

#include "libplan/graph/op_graph.h"
#include "libplan/model/cluster.h"
#include "libplan/model/model.h"
#include "libplan/plan/plan.h"
#include "libplan/util/status.h"

namespace spindle::plan {

// Checks, in order: the model hash and name; that the MetaOps partition the
// model's operators into chains of identical workload with correct inputs and
// levels; rules 1-6 of spec/plan.md; waves indexed in order; every time and
// byte figure finite and >= 0. Returns every
// violation found (empty when the plan is valid), each naming the rule and
// the wave/slice/MetaOp/param it concerns.
std::vector<std::string> check_plan(const Plan& plan, const Model& model, const OpGraph& graph);

// Rules 1-3 of spec/plan.md from the plan alone (check_plan reports them
// too): each MetaOp's slices cover its operators in order, one per wave
// (1); a MetaOp starts after its inputs end (2); a device runs one slice
// per wave, inside the cluster (3). Empty when they hold. The planner's
// wave swaps (planner/shift.h) are refused when a swap would break one.
std::vector<std::string> check_wave_order(const Plan& plan);

// Consistency of the plan with the cluster it is to run on: the same device
// count, island size, device memory and name. Empty when they agree.
std::vector<std::string> check_plan_cluster(const Plan& plan, const Cluster& cluster);

// As above, folded into one error (the first few violations) for callers
// that only need pass/fail; with `cluster`, check_plan_cluster too.
Status check_plan_status(const Plan& plan, const Model& model, const OpGraph& graph,
                         const std::string& plan_path, const Cluster* cluster = nullptr);

}  // namespace spindle::plan
