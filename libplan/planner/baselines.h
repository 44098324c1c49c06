// The baseline strategies task-level (Optimus style) and intra-task (DistMM
// style) of docs/planner.md, "Baselines": abstract waves (device counts, no
// concrete devices) that make_plan places and costs like every strategy.
#pragma once

#include <vector>

#include "libplan/cost/curve.h"
#include "libplan/graph/contract.h"
#include "libplan/waves/schedule.h"

namespace spindle::plan {

// What the baselines read, all indexed by MetaOp id (none owned). Every
// MetaOp's inputs lie in its own task (tasks are disjoint subgraphs,
// spec/model.md), which both baselines rely on for rule 2.
struct BaselineInput {
  const Contraction* contraction = nullptr;
  const std::vector<const ScalingCurve*>* curves = nullptr;   // never null
  const std::vector<std::vector<int>>* valid = nullptr;       // ascending, never empty
  int tasks = 0;                                              // Model::tasks.size()
  int devices = 0;                                            // N >= every valid count
};

// A slot running all of MetaOp `id` on n devices: count * T(n) ms.
AbstractSlot whole_metaop_slot(const BaselineInput& in, int id, int n);

// Task-level device shares (Optimus style) of `tasks` (task indices) on
// `devices` devices: each task starts at its smallest share, the largest
// smallest-valid-count among its MetaOps; then, while devices remain, the
// task with the largest marginal gain (T(n) - T(n')) / (n' - n) to its next
// share n' that still fits takes it (ties: the lower task index). A task's
// shares are the valid counts of its MetaOps at or above its smallest share,
// and T(n) = sum over its MetaOps of L_m T_m(largest valid count <= n).
// Requires the smallest shares to fit in `devices`. Same order as `tasks`.
std::vector<int> task_level_shares(const BaselineInput& in, const std::vector<int>& tasks,
                                   int devices);

// Task-level: tasks side by side, each on its share, its MetaOps in
// topological order one after another, each whole on the largest valid count
// within the share. Wave k holds the k-th MetaOp of every task. When the
// smallest shares of all tasks exceed the cluster, tasks are packed in order
// into consecutive groups whose smallest shares fit;
// groups run one after another, each planned as above on the whole cluster.
std::vector<AbstractWave> task_level_waves(const BaselineInput& in);

// Intra-task (DistMM style): tasks one after another; within a task, one wave
// per MetaLevel holding the task's MetaOps of that level side by side, each
// whole. Their device counts come from the level's relaxed optimum
// (relax_level on the whole cluster): each n* rounded down to a valid count
// (at least the smallest); while the sum exceeds the cluster, the MetaOp that
// slows least (relative) steps down to its next lower valid count; then idle
// devices go to the slowest MetaOp while its next valid count fits. When even
// the smallest counts do not fit, the level's MetaOps are packed in id order
// into consecutive waves whose smallest counts fit, each allocated the same way.
std::vector<AbstractWave> intra_task_waves(const BaselineInput& in);

}  // namespace spindle::plan
