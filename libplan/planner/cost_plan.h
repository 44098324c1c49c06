// Wave-barrier costing of a placed plan (docs/planner.md, step 9): fills
// wave.transfer_ms, param_groups and every field of Plan::predicted except
// relaxed_optimum_ms and simulated_ms (the planner's objective, libplan/sim),
// resetting simulated_ms to 0.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "libplan/cost/cost_model.h"
#include "libplan/graph/op_graph.h"
#include "libplan/model/model.h"
#include "libplan/plan/plan.h"
#include "libplan/rules/memory.h"
#include "libplan/rules/rows.h"

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

// The parameters of MetaOps whose operators are the graph indices `ops`
// (per MetaOp, in position order), as costing counts them: sorted by name (param_groups come out sorted), each costed from
// the first operator of the graph holding it (op_shard_values x
// dtype_bytes), and per MetaOp each position's parameter index.
struct PlanParams {
  std::vector<CostTables::Param> params;   // by name
  std::vector<std::vector<int>> of_metaop; // [MetaOp][position] -> index into params
};
PlanParams plan_params(const std::vector<std::vector<int>>& ops, const Model& model, const OpGraph& graph,
                       int dtype_bytes);

// One tensor-parallel shard of a parameter on one device. spindle-run
// allocates one shard per (parameter, TP rank) on every device that runs
// the parameter at that rank, and a slice's device at position i runs
// rank i % K (rules/rows.h): a device that runs a parameter at two ranks
// (two slices sharing a tensor-parallel module, placed differently)
// holds two shards, and a rank's holders are its data-parallel replicas.
struct HeldShard {
  int param = 0;    // the caller's parameter index
  int rank = 0;     // TP rank
  int device = 0;
  auto operator<=>(const HeldShard&) const = default;
};
// The shards `plan`'s slices hold, sorted, each once. param_of(m, k) is the
// parameter index of operator position k of MetaOp m (< 0: none).
template <class ParamOf>
std::vector<HeldShard> held_shards(const Plan& plan, ParamOf param_of) {
  std::vector<HeldShard> held;
  for (const Wave& wave : plan.waves)
    for (const Slice& s : wave.slices) {
      const PlanMetaOp& m = plan.metaops[static_cast<size_t>(s.metaop)];
      const RowLayout layout{m.workload.batch, static_cast<int>(s.devices.size()), m.tensor_parallel};
      for (int k = s.first; k < s.first + s.count; ++k) {
        const int p = param_of(s.metaop, k);
        if (p < 0) continue;
        for (size_t i = 0; i < s.devices.size(); ++i)
          held.push_back({p, layout.tp_rank_of(static_cast<int>(i)), s.devices[i]});
      }
    }
  std::sort(held.begin(), held.end());
  held.erase(std::unique(held.begin(), held.end()), held.end());
  return held;
}
// Adds into bytes[device] the state (rules/memory.h param_state_bytes) of
// every shard in `held` (sorted, each once; param indexes `params`): its
// shard_bytes over the holders of its (param, rank) as data-parallel
// replicas, the optimizer state counted as `state` says.
void add_held_state(const std::vector<HeldShard>& held, const std::vector<CostTables::Param>& params,
                    int dtype_bytes, OptimizerState state, std::vector<double>& bytes);

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
