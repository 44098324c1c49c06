// The planner's entry point: model + cluster + cost model -> wave plan.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "libplan/cost/cost_model.h"
#include "libplan/graph/contract.h"
#include "libplan/graph/op_graph.h"
#include "libplan/model/cluster.h"
#include "libplan/lower/lower.h"
#include "libplan/model/model.h"
#include "libplan/place/place.h"
#include "libplan/plan/plan.h"
#include "libplan/planner/shift.h"
#include "libplan/util/status.h"

namespace spindle::plan {

enum class Strategy { spindle, sequential, task_level, intra_task };
const char* strategy_name(Strategy s);
Result<Strategy> parse_strategy(const std::string& name);

// How abstract waves become device ids (docs/planner.md, step 8).
//   islands:    island-, locality-, parameter- and memory-aware (the default);
//   sequential: each wave's slots on the lowest free contiguous devices, in
//               slot order: the naive placement, to measure what placement saves.
enum class Placement { islands, sequential };
const char* placement_name(Placement p);
Result<Placement> parse_placement(const std::string& name);

// `--optimizer-state auto` searches a plan that fits replicated a second
// time, with the state sharded, only up to this many MetaOps
// (PlanRequest::sharded_search_metaops; every shipped workload has at most
// 70): on 50 tasks on 1024 devices (350 MetaOps) that search doubled the
// planning time, 1.55 -> 3.13 s, and found the plan the re-simulation had
// already switched to. Above it, auto keeps what the re-simulation chose;
// `--optimizer-state sharded` searches sharded from the start.
inline constexpr int kShardedSearchMetaOps = 256;

struct PlanRequest {
  const Model* model = nullptr;
  const OpGraph* graph = nullptr;          // expand(*model)
  const Cluster* cluster = nullptr;
  const CostModel* cost = nullptr;
  std::string profile_sha256;              // recorded in the plan
  Strategy strategy = Strategy::spindle;
  // Spindle only, beyond the paper (docs/planner.md, step 7): also schedule all MetaLevels
  // as one pool, a MetaOp starting as soon as its own inputs are done, and
  // keep that plan when its compute time is shorter. Off: level after level
  // only, as the paper does. Such a plan may beat the per-level relaxed
  // optimum (its gap below 1).
  bool start_early = true;
  // Spindle only: also place and simulate the baselines' schedules
  // (sequential, task-level, intra-task) and keep one when it simulates
  // fastest, so that Spindle is never predicted slower than a baseline. Off:
  // Spindle's own portfolio only.
  bool baseline_candidates = true;
  // Spindle only: also schedule the allocation in which no
  // MetaOp runs on more devices than its gradients' all-reduce pays for
  // (its count n minimising L T(n) + that all-reduce), and keep it when it
  // simulates fastest. Such a plan trades compute for sync: its compute gap
  // to the (uncapped) relaxed optimum may be large. Off: the paper's
  // allocation only.
  bool comm_aware_candidates = true;
  // Spindle only, with comm_aware_candidates: also the allocation capped
  // with each MetaOp's gradient bytes counted twice (a device's all-reduces
  // queue behind one another), its first two schedules one more candidate
  // group (docs/planner.md, "Communication-aware caps"). Off: the caps
  // above alone.
  bool queued_sync_candidates = true;
  // Spindle only, on clusters of 16 islands or more: also plan
  // on the cluster's first half of the islands (recursively, down to 8) and
  // keep that plan, the other devices idle, when it simulates faster: from
  // 8 islands on, doubling the islands never makes Spindle's plan
  // predicted slower. Off: the whole cluster only.
  bool fewer_islands = true;
  Placement placement = Placement::islands;
  // Spindle only (docs/planner.md, step 9): at most this many simulations
  // of boundary shifts on the winning plan (planner/shift.h), each kept
  // when it simulates no slower with and without communication and faster
  // on one. 0: none, the plan as placed.
  int shift_simulations = kShiftSimulations;
  // Every strategy: how gradients are synchronised (by default overlapping
  // the backward pass, in buckets of at most 25 MiB, as spindle-run runs
  // them; lower.h). The objective follows.
  GradSync sync = {};
  // Every strategy: the plan's bucket cap (Plan::bucket_bytes) is the
  // fastest simulated of sync.bucket_bytes and kBucketCapsMb, chosen for
  // the final waves (ties: the smaller), which were planned and shifted
  // with sync.bucket_bytes; cluster shares (fewer_islands) are compared at
  // their best caps (docs/planner.md, "Bucket cap"). Off: sync.bucket_bytes
  // (spindle-plan --bucket-mb).
  bool choose_bucket_bytes = true;
  // How the optimizer state is held (rules/memory.h), recorded in the plan
  // and followed by spindle-run: sharded over the replicas (ZeRO-1,
  // Megatron's distributed optimizer; the paper's assumption) or replicated.
  // Every strategy. With choose_optimizer_state (spindle-plan
  // --optimizer-state auto, the default) this is ignored: the plan is made
  // replicated, and made again sharded when that one does not fit the
  // devices (check_plan_memory): sharding costs an all-gather per bucket
  // and step, which a plan that fits need not pay. A plan that fits is
  // kept replicated unless it simulates faster sharded, or comes within
  // 2% of that and a search with the state sharded (for plans of at most
  // sharded_search_metaops MetaOps) finds a faster one (docs/planner.md,
  // "Memory").
  OptimizerState optimizer_state = OptimizerState::sharded;
  bool choose_optimizer_state = true;
  int sharded_search_metaops = kShardedSearchMetaOps;
  // How placement's running memory estimate (place/place.h) counts the
  // state, when not as optimizer_state: choose_optimizer_state's first,
  // replicated plan is placed counting it sharded, as every plan was
  // placed before spindle-run sharded it, so that a plan that fits either
  // way is the one planned before (its memory then checked replicated).
  std::optional<OptimizerState> placement_state = std::nullopt;
};

// The bucket caps the planner tries besides the request's (MiB, ascending;
// PlanRequest::choose_bucket_bytes). A bucket holds whole shards of one
// holder set (lower.h, GradSync::bucket_bytes): one transformer layer of
// the ImageBind vision encoder is 78.7 MB of fp32 gradients, so caps up
// to 75 MiB cut the same buckets there, and larger ones merge layers.
inline constexpr double kBucketCapsMb[] = {25, 50, 100, 200, 400, 800};

// What placement (libplan/place) is told of the MetaOps of `contraction`
// (contract(*request.graph)): inputs, sizes, parameters, activation and
// gradient bytes on the wire; and of the cluster and cost model.
PlaceInput placement_input(const Contraction& contraction, const PlanRequest& request);

// Plans one strategy: of its candidate schedules, each placed, the one whose
// lowered programs simulate fastest (predicted.simulated_ms; docs/planner.md,
// section 9). Errors (as values) when no valid plan exists, e.g. a MetaOp
// with no valid device count on this cluster. The result obeys every rule of
// spec/plan.md (check_plan) and is deterministic (the same whatever the
// number of threads it runs on). Spindle's plan may exceed device memory
// (the caller's check_plan_memory reports it) only when no baseline's plan
// fits either: otherwise the fastest baseline plan that fits is returned as
// Spindle's, with Plan::fitted_from set (docs/planner.md, "Memory").
Result<Plan> make_plan(const PlanRequest& request);

// The relaxed optimum of `plan`'s widths, ms: as Predicted::relaxed_optimum_ms
// (sum over MetaLevels of C*, each MetaOp's operators spread continuously
// on n devices), with each MetaOp capped at the most devices of any of its
// slices in `plan` instead of its largest valid count. A lower bound on
// the compute of any level-by-level schedule that spreads no MetaOp wider
// than `plan` does: the compute-only makespan over it, minus 1, is how
// well the waves are packed apart from how wide the allocation chose to
// spread (the communication-capped plans, docs/planner.md section 5, give
// up width on purpose). Equal to relaxed_optimum_ms when every MetaOp runs
// somewhere on its largest valid count, never below it. Errors when a
// MetaOp has no slice or the cost model no curve for it.
Result<double> width_optimum_ms(const Plan& plan, const CostModel& cost);
// The width gap: the compute-only makespan that `compute_gap`
// (simulated_compute_gap of `plan`) was read from, over `width_optimum_ms`
// (width_optimum_ms of `plan`, > 0) instead of the relaxed optimum, minus 1.
inline double width_gap(const Plan& plan, double compute_gap, double width_optimum_ms) {
  return (1 + compute_gap) * plan.predicted.relaxed_optimum_ms / width_optimum_ms - 1;
}

// Communication-aware allocation: of `valid` (ascending, non-empty), the
// device count n that minimises length x curve.time_ms(n) + the all-reduce
// of `grad_bytes` over its data-parallel replicas (n / tensor_parallel of
// them, TP rank 0's of a block from an island's start), ties to
// the smaller: the most devices a MetaOp of `length` operators is worth
// once its gradients must be summed. With `gather` (the optimizer state
// sharded, ZeRO-1) a reduce-scatter and the values' all-gather over the
// same replicas instead. PlanRequest::comm_aware_candidates.
int comm_aware_cap(int length, const ScalingCurve& curve, const std::vector<int>& valid, int tensor_parallel,
                   double grad_bytes, const CostModel& cost, bool gather = false);

}  // namespace spindle::plan
