#include "libplan/planner/planner.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>

#include "libplan/alloc/alloc.h"
#include "libplan/graph/contract.h"
#include "libplan/model/ops.h"
#include "libplan/place/place.h"
#include "libplan/rules/links.h"
#include "libplan/rules/rows.h"
#include "libplan/planner/baselines.h"
#include "libplan/planner/cost_plan.h"
#include "libplan/planner/feasibility.h"
#include "libplan/planner/shift.h"
#include "libplan/sim/sim.h"
#include "libplan/waves/portfolio.h"
#include "libplan/util/limits.h"
#include "libplan/util/parallel.h"
#include "libplan/waves/schedule.h"

namespace spindle::plan {

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::spindle: return "spindle";
    case Strategy::sequential: return "sequential";
    case Strategy::task_level: return "task-level";
    case Strategy::intra_task: return "intra-task";
  }
  return "?";
}

Result<Strategy> parse_strategy(const std::string& name) {
  for (Strategy s : {Strategy::spindle, Strategy::sequential, Strategy::task_level,
                     Strategy::intra_task}) {
    if (name == strategy_name(s)) return s;
  }
  return Error{"unknown strategy '" + name +
               "' (expected spindle, sequential, task-level or intra-task)"};
}

const char* placement_name(Placement p) {
  switch (p) {
    case Placement::islands: return "islands";
    case Placement::sequential: return "sequential";
  }
  return "?";
}

Result<Placement> parse_placement(const std::string& name) {
  for (Placement p : {Placement::islands, Placement::sequential})
    if (name == placement_name(p)) return p;
  return Error{"unknown placement '" + name + "' (expected islands or sequential)"};
}

namespace {

// Spindle also plans on half the islands (PlanRequest::fewer_islands) on
// clusters of at least this many: each halving costs about one more
// planning, and up to the paper's 8 islands more islands have made every
// shipped workload faster (bench/history.md, paper), while beyond them the batch
// runs out and the same work's gradient sums only spread wider.
constexpr int kFewerIslandsFrom = 16;
// The half is not planned when its compute alone, packed as this plan packs
// its own (at most this much over the work bound), cannot beat this plan.
constexpr double kMaxPackingSlack = 0.1;
// The halving of the islands (plan_beating) goes on past a share that does
// not win only while it is at most this much slower than the best plan.
constexpr double kHalvingSlack = 0.1;
// Island placement passes (place_islands with the previous pass as hint).
constexpr int kPlacementPasses = 3;
// Schedules whose first placement pass simulates fastest that get the
// further passes.
constexpr size_t kRefinedSchedules = 2;
// Of the portfolio on the communication-aware allocation, the schedules
// placed and simulated (each costs as much as one of the paper's): the
// first kCappedSchedules as one candidate group, the next
// kMoreCappedSchedules as another. The portfolio ranks its schedules by
// compute time, which on many islands predicts the simulated makespan
// poorly; a group of their own keeps the further ones from taking the
// first ones' refinement (on multitask-clip-10, a800-4x8, the first two
// give 218.1 ms and the next two 204.9; a change in the profile's 7th
// digit had swapped them).
constexpr size_t kCappedSchedules = 2;
constexpr size_t kMoreCappedSchedules = 2;
// The communication-aware allocation once more with each MetaOp's
// gradient bytes counted this many times over (comm_capped's
// bytes_weight): a device runs its all-reduces one at a time, so a
// MetaOp's sum waits behind the others of its devices, which the cap,
// pricing each sum alone, ignores. Its first kCappedSchedules schedules
// are one more candidate group. docs/planner.md, "Communication-aware
// caps", has what it gains and the weights and variants that did worse.
constexpr double kQueuedSyncWeight = 2.0;

// The candidates are compared before their lowering choices, boundary
// shifts and bucket cap, which gain the schedules of one candidate group
// more than another's: on multitask-clip-4, a800-8x8, sharded, the
// uncapped allocation's best schedule simulates at 183.093 ms and the
// capped one's at 184.210 (+0.6%), but after the transfers and gathers
// are chosen 166.721 and 160.034, shifted 164.094 and 146.935, at their
// best caps 152.408 and 141.451 ms. So the best placement of another
// candidate group than the winner's, when it simulates within this share
// of the winner before and after both their transfers and gathers are
// chosen, is made a plan as well (a runner-up, only where the shifts run),
// and the faster of the two finished plans kept (plan_state). 2%, as
// kShardedSearchWithin; it costs one more shift search where a runner-up
// is that close (docs/planner.md, "Runner-up").
constexpr double kRunnerUpWithin = 0.02;

// `--optimizer-state auto`, a plan that fits replicated: when re-simulated
// sharded (shard_if_faster) it comes within this share of its replicated
// figure, or under it, the model is planned again with the state sharded
// and the faster plan kept. On the 19 A800 cases of bench/paper's models
// (analytic profiles, 2026-12-05) every case where that search won (by
// 0.2-9.1%) came within 1.3% or under; every case further off than 2%
// lost it (by 2.2-22%). docs/planner.md, "Memory". Only for plans of at
// most PlanRequest::sharded_search_metaops MetaOps.
constexpr double kShardedSearchWithin = 0.02;

// The capped allocation is scheduled again without narrowed tails only up
// to this many MetaOps (every shipped workload has at most 70): on 50 and
// 1000 tasks on 1024 devices (350 and 7000 MetaOps) that portfolio and its
// placements cost 0.83 -> 0.91 s and 3.7 -> 4.6-6.9 s of planning and
// changed neither plan.
constexpr size_t kMaxWideTailMetaOps = 256;

// A baseline's schedule joins Spindle's candidates only up to this many
// (slot, device) pairs: lowering and simulating it costs about that many
// instructions twice over (the sequential schedule of 1000 tasks on 1024
// devices has 7.2 million and would take seconds; multitask-clip-10's on 64
// devices has 4480).
constexpr int64_t kMaxBaselineCandidateSlots = 200000;

size_t slot_count(const std::vector<AbstractWave>& waves) {
  size_t n = 0;
  for (const AbstractWave& w : waves) n += w.slots.size();
  return n;
}

int64_t slot_devices(const std::vector<AbstractWave>& waves) {
  int64_t n = 0;
  for (const AbstractWave& w : waves)
    for (const AbstractSlot& s : w.slots) n += s.devices;
  return n;
}

// What the strategies share: the contraction, each MetaOp's curve and valid
// device counts, and the relaxed optimum per level.
struct Prepared {
  Contraction contraction;
  std::vector<const ScalingCurve*> curves;   // by MetaOp id, never null
  std::vector<std::vector<int>> valid;       // by MetaOp id, never empty
  std::vector<std::vector<int>> by_level;    // MetaOp ids of each level, ascending
  std::vector<RelaxedAllocation> relaxed;    // by level
  double relaxed_optimum_ms = 0;             // sum over levels of C* (relaxed_bound_ms)
};

// The relaxed optimum of every level (each MetaOp capped at its largest
// valid count) and their sum.
void relax_levels(Prepared& p, int n_dev) {
  p.relaxed.clear();
  p.relaxed_optimum_ms = 0;
  for (const std::vector<int>& ids : p.by_level) {
    std::vector<AllocItem> items;
    for (int id : ids)
      items.push_back({p.contraction.metaops[static_cast<size_t>(id)].length(),
                       p.curves[static_cast<size_t>(id)], p.valid[static_cast<size_t>(id)].back()});
    p.relaxed.push_back(relax_level(items, n_dev));
    p.relaxed_optimum_ms += relaxed_bound_ms(items, n_dev, p.relaxed.back());
  }
}

// A lower bound on any schedule's makespan of `p` on `devices` devices:
// every MetaOp occupies at least L min_n n T(n) device-ms (n over its
// valid counts), and the devices share that work.
double work_bound_ms(const Prepared& p, int devices) {
  double area = 0;
  for (const MetaOp& m : p.contraction.metaops) {
    double least = std::numeric_limits<double>::infinity();
    for (int n : p.valid[static_cast<size_t>(m.id)])
      least = std::min(least, n * p.curves[static_cast<size_t>(m.id)]->time_ms(n));
    area += m.length() * least;
  }
  return area / devices;
}

// Gradient bytes on the wire of one operator of `m` (one TP shard), as the
// lowering all-reduces them.
double op_sync_bytes(const MetaOp& m, const PlanRequest& req) {
  const Operator& first = req.graph->ops[static_cast<size_t>(m.operators.front())];
  return static_cast<double>(op_shard_values(first, *req.model)) * kWireBytesPerValue;
}

Result<Prepared> prepare(const PlanRequest& req) {
  Prepared p;
  const Model& model = *req.model;
  const int n_dev = req.cluster->devices();
  // A profile from a file holds one curve per workload, whatever module asks.
  SPINDLE_TRY(check_profile_keys(model, *req.graph));
  p.contraction = contract(*req.graph);
  // The scheduler keeps a time per MetaOp and device count: bounded (limits.h)
  // so that a huge cluster under a large model is an error, not bad_alloc.
  const int64_t cells = static_cast<int64_t>(p.contraction.metaops.size()) * n_dev;
  if (cells > limits::kMaxMetaOpDevices)
    return Error{(model.path.empty() ? model.name : model.path) + ": " +
                 std::to_string(p.contraction.metaops.size()) + " MetaOps on cluster '" + req.cluster->name +
                 "' (" + std::to_string(n_dev) + " devices): MetaOps x devices = " + std::to_string(cells) +
                 " is more than the planner's limit " + std::to_string(limits::kMaxMetaOpDevices) +
                 " (docs/hardening.md); plan on fewer devices or a smaller model"};
  // Scheduling costs about MetaOps x waves, and there are at least about
  // operators / devices waves: bounded so that no model plans for minutes.
  const int64_t work = static_cast<int64_t>(p.contraction.metaops.size()) *
                       static_cast<int64_t>(req.graph->ops.size()) / std::max(n_dev, 1);
  if (work > limits::kMaxScheduleWork)
    return Error{(model.path.empty() ? model.name : model.path) + ": " +
                 std::to_string(p.contraction.metaops.size()) + " MetaOps and " +
                 std::to_string(req.graph->ops.size()) + " operators on " + std::to_string(n_dev) +
                 " devices: MetaOps x operators / devices = " + std::to_string(work) +
                 " is more than the planner's limit " + std::to_string(limits::kMaxScheduleWork) +
                 " (docs/hardening.md); plan on more devices or with fewer tasks"};
  for (const MetaOp& m : p.contraction.metaops) {
    const Operator& first = req.graph->ops[static_cast<size_t>(m.operators.front())];
    const std::string& task = model.tasks[static_cast<size_t>(m.task)].name;
    const ScalingCurve* curve = req.cost->curve(m.workload);
    if (curve == nullptr)
      return Error{"no scaling curve for workload " + m.workload.key() + " (operator '" +
                   first.id + "' of task '" + task + "'): profile the model first"};
    std::vector<int> valid = valid_device_counts(n_dev, m.tensor_parallel, m.workload.batch);
    if (valid.empty())
      return Error{"operator '" + first.id + "' of task '" + task + "' (batch " +
                   std::to_string(m.workload.batch) + ", tensor_parallel " +
                   std::to_string(m.tensor_parallel) + ") has no valid device count on cluster '" +
                   req.cluster->name + "' (" + std::to_string(n_dev) + " devices)"};
    p.curves.push_back(curve);
    p.valid.push_back(std::move(valid));
  }
  p.by_level.resize(static_cast<size_t>(p.contraction.levels));
  for (const MetaOp& m : p.contraction.metaops)
    p.by_level[static_cast<size_t>(m.level)].push_back(m.id);
  relax_levels(p, n_dev);
  return p;
}

}  // namespace

PlaceInput placement_input(const Contraction& contraction, const PlanRequest& req) {
  const OpGraph& graph = *req.graph;
  const Cluster& cluster = *req.cluster;
  PlaceInput in;
  in.dtype_bytes = dtype_bytes(req.model->dtype);
  in.devices = cluster.devices();
  in.devices_per_island = cluster.devices_per_island;
  in.memory_bytes = static_cast<double>(cluster.memory_bytes());
  in.optimizer_state = req.placement_state.value_or(req.optimizer_state);
  in.cost = req.cost;
  std::map<std::string, int> param_index;
  for (const MetaOp& m : contraction.metaops) {
    PlaceMetaOp pm;
    pm.inputs = m.inputs;
    pm.tensor_parallel = m.tensor_parallel;
    pm.batch = m.workload.batch;
    const Operator& first = graph.ops[static_cast<size_t>(m.operators.front())];
    // On the wire, as the lowering moves them (rules/links.h).
    const Workload& w = first.workload;
    pm.out_bytes_per_sample = static_cast<double>(op_out_values_per_sample(w.op, w.dims, w.seq)) * kWireBytesPerValue;
    // Every operator of a MetaOp has its workload and tensor_parallel
    // (contraction): the cost model is asked once per MetaOp.
    // One TP shard in the model dtype, as the runtime holds it (op_shard_values).
    const double bytes = static_cast<double>(op_shard_values(first, *req.model)) * in.dtype_bytes;
    const auto act_bytes = static_cast<double>(req.cost->activation_bytes_per_sample(m.workload));
    const double sync_bytes = op_sync_bytes(m, req);
    for (int o : m.operators) {
      const Operator& op = graph.ops[static_cast<size_t>(o)];
      int index = -1;
      if (bytes > 0) {
        auto [it, added] = param_index.emplace(op.param, static_cast<int>(in.param_bytes.size()));
        if (added) {
          in.param_bytes.push_back(bytes);
          in.param_sync_bytes.push_back(sync_bytes);
        }
        index = it->second;
      }
      pm.param.push_back(index);
      pm.act_bytes_per_sample.push_back(act_bytes);
    }
    in.metaops.push_back(std::move(pm));
  }
  return in;
}

namespace {

// One placed candidate and its objective.
struct Costed {
  std::vector<WavePlacement> placed;
  double simulated_ms = 0;   // infinity when its simulation stopped at its bound
  BucketStarts starts = BucketStarts::in_order;
  bool starts_matter = true;  // the other bucket-start rule would lower other programs (Simulation)
  size_t schedule = 0;        // the candidate placed (CandidateSearch::refine's result)
};

// Sets the plan's waves to the placed abstract waves, slice ms = count *
// T(n), transfer_ms 0 (costing fills it). Overwrites every field of the
// waves already there, reusing their storage.
void emit_waves(const std::vector<AbstractWave>& waves, const std::vector<WavePlacement>& placed, Plan& plan) {
  plan.waves.resize(waves.size());
  for (size_t w = 0; w < waves.size(); ++w) {
    Wave& wave = plan.waves[w];
    wave.index = static_cast<int>(w);
    wave.ms = 0;
    wave.transfer_ms = 0;
    wave.slices.resize(waves[w].slots.size());
    for (size_t s = 0; s < waves[w].slots.size(); ++s) {
      const AbstractSlot& a = waves[w].slots[s];
      Slice& slice = wave.slices[s];
      slice.metaop = a.metaop;
      slice.first = a.first;
      slice.count = a.count;
      slice.devices = placed[w].slot_devices[s];
      slice.ms = a.ms;
      wave.ms = std::max(wave.ms, slice.ms);
    }
  }
}

bool same_tuples(const std::vector<AllocTuple>& a, const std::vector<AllocTuple>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const AllocTuple& x, const AllocTuple& y) {
    return x.devices == y.devices && x.count == y.count;
  });
}


// Spindle: per level, bi-point discretisation of the relaxed optimum
// (docs/planner.md, steps 5-6), then the scheduler's portfolio (step 7,
// waves/portfolio.h). Returns a few distinct schedules (placement and
// costing pick among them).
PortfolioSchedules spindle_waves(const Prepared& p, int n_dev, int island, bool start_early,
                                 bool narrow_tails = true) {
  // Two discretisations: l_hi rounded to the nearest integer per MetaOp (the
  // paper's, `items`) and rounded per level to the least level bound
  // (discretise_level, `level_rounded`; left empty when both agree).
  std::vector<ScheduleItem> items(p.contraction.metaops.size());
  std::vector<ScheduleItem> level_rounded;
  std::vector<std::vector<AllocTuple>> level_tuples(items.size());
  bool rounding_differs = false;
  for (size_t l = 0; l < p.by_level.size(); ++l) {
    const RelaxedAllocation& r = p.relaxed[l];
    std::vector<AllocItem> alloc;
    std::vector<std::vector<int>> valid;
    for (size_t k = 0; k < p.by_level[l].size(); ++k) {
      const auto id = static_cast<size_t>(p.by_level[l][k]);
      const MetaOp& m = p.contraction.metaops[id];
      ScheduleItem& it = items[id];
      it.level = m.level;
      it.inputs = m.inputs;
      it.length = m.length();
      it.valid = p.valid[id];
      it.time_ms.assign(static_cast<size_t>(n_dev) + 1, 0.0);
      for (int n : it.valid) it.time_ms[static_cast<size_t>(n)] = p.curves[id]->time_ms(n);
      it.tuples = discretise(it.length, *p.curves[id], r.n_star[k], r.c_star_ms, it.valid);
      alloc.push_back({it.length, p.curves[id], it.valid.back()});
      valid.push_back(it.valid);
    }
    std::vector<std::vector<AllocTuple>> tuples = discretise_level(alloc, r, valid, n_dev);
    for (size_t k = 0; k < tuples.size(); ++k) {
      const auto id = static_cast<size_t>(p.by_level[l][k]);
      rounding_differs = rounding_differs || !same_tuples(tuples[k], items[id].tuples);
      level_tuples[id] = std::move(tuples[k]);
    }
  }
  if (rounding_differs) {
    level_rounded = items;
    for (size_t id = 0; id < items.size(); ++id) level_rounded[id].tuples = std::move(level_tuples[id]);
  }

  PortfolioInput in;
  in.items = &items;
  in.level_rounded = &level_rounded;
  in.levels = static_cast<int>(p.by_level.size());
  in.devices = n_dev;
  in.island = island;
  in.start_early = start_early;
  in.narrow_tails = narrow_tails;
  return schedule_portfolio(in);
}

// Communication-aware allocation (docs/planner.md): `p` with each MetaOp's valid
// device counts cut at the count n that minimises L T(n) + the all-reduce
// of its L operators' gradients, their bytes x `bytes_weight`, over n
// devices (a block from an island's start, as placement packs them;
// comm_aware_cap), ties to the smaller: spread wider, a MetaOp gains less
// compute than its gradients cost to sum. Levels re-relaxed with those
// caps. Empty when no MetaOp is cut (the caller already has those
// schedules).
std::optional<Prepared> comm_capped(const Prepared& p, const PlanRequest& req, double bytes_weight) {
  Prepared q = p;
  bool cut = false;
  for (const MetaOp& m : p.contraction.metaops) {
    const double grad_bytes = m.length() * op_sync_bytes(m, req) * bytes_weight;
    std::vector<int>& valid = q.valid[static_cast<size_t>(m.id)];
    const int cap = comm_aware_cap(m.length(), *p.curves[static_cast<size_t>(m.id)], valid, m.tensor_parallel,
                                   grad_bytes, *req.cost, req.optimizer_state == OptimizerState::sharded);
    if (cap < valid.back()) {
      valid.erase(std::upper_bound(valid.begin(), valid.end(), cap), valid.end());
      cut = true;
    }
  }
  if (!cut) return std::nullopt;
  relax_levels(q, req.cluster->devices());
  return q;
}

// Sequential (Megatron-LM / DeepSpeed style): task after task, each MetaOp in
// topological order alone in one wave on its largest valid device count.
std::vector<AbstractWave> sequential_waves(const Prepared& p, const BaselineInput& baseline) {
  std::vector<AbstractWave> waves;
  for (size_t task = 0;; ++task) {
    bool any_later = false;
    for (const MetaOp& m : p.contraction.metaops) {
      if (static_cast<size_t>(m.task) > task) any_later = true;
      if (static_cast<size_t>(m.task) != task) continue;
      const AbstractSlot slot =
          whole_metaop_slot(baseline, m.id, p.valid[static_cast<size_t>(m.id)].back());
      waves.push_back({{slot}, slot.ms});
    }
    if (!any_later) break;
  }
  return waves;
}

}  // namespace

namespace {

// The schedules a strategy places and simulates, in candidate groups: group
// 0 is Spindle's portfolio on the paper's allocation and, from `own` on, the
// baselines' schedules; groups 1 and 2 the portfolio on the
// communication-aware allocation, then (when scheduled) that portfolio
// without narrowed tails and the one on the queued caps
// (kQueuedSyncWeight), a group each time. Each group's best kRefinedSchedules get
// the further placement passes (CandidateSearch), so a group added never
// costs the others their refinement. Other strategies: one schedule.
struct Candidates {
  std::vector<std::vector<AbstractWave>> waves;
  size_t own = 0;                      // Spindle's own schedules: waves[0, own)
  std::vector<size_t> group_begin{0};  // each group's first index into waves

  int groups() const { return static_cast<int>(group_begin.size()); }
  int group_of(size_t c) const {
    if (c >= own) return 0;
    return static_cast<int>(std::upper_bound(group_begin.begin(), group_begin.end(), c) - group_begin.begin()) - 1;
  }
};

// Appends `schedules` to `c` as groups of kCappedSchedules, then
// kMoreCappedSchedules (the rest left out), skipping those already
// candidates.
void add_groups(Candidates& c, std::vector<std::vector<AbstractWave>> schedules) {
  size_t next = 0;
  for (size_t size : {kCappedSchedules, kMoreCappedSchedules}) {
    const size_t begin = c.waves.size();
    for (; next < schedules.size() && c.waves.size() - begin < size; ++next) {
      bool seen = false;
      for (const std::vector<AbstractWave>& other : c.waves) seen = seen || same_schedule(other, schedules[next]);
      if (!seen) c.waves.push_back(std::move(schedules[next]));
    }
    if (c.waves.size() > begin) c.group_begin.push_back(begin);
  }
}

Candidates strategy_candidates(const Prepared& p, const PlanRequest& request) {
  const Cluster& cluster = *request.cluster;
  const BaselineInput baseline{&p.contraction, &p.curves, &p.valid,
                               static_cast<int>(request.model->tasks.size()), cluster.devices()};
  Candidates c;
  switch (request.strategy) {
    case Strategy::spindle: {
      c.waves = spindle_waves(p, cluster.devices(), cluster.devices_per_island, request.start_early).schedules;
      // And the same portfolio with no MetaOp spread wider than its
      // gradients' sum pays for: on many islands the widest counts cost
      // more in all-reduce than they save in compute (groups 1 and 2).
      // Then that portfolio again with no slot taking over a wider tuple's
      // operators (ScheduleOptions::narrow_tails; groups 3 and 4, without
      // the schedules already candidates): those fill the waves less, but
      // without wave barriers a chain run narrower than allocated can
      // become the makespan (multitask-clip-10 on a800-2x8: 324.5 ms
      // against 346.9; on a800-4x8 the narrowed tails still win).
      // Only when a schedule of the first portfolio did narrow a tail (else
      // the second would almost always repeat it, costing a portfolio),
      // and not on huge models (kMaxWideTailMetaOps).
      const std::optional<Prepared> capped =
          request.comm_aware_candidates ? comm_capped(p, request, 1.0) : std::nullopt;
      if (capped) {
        PortfolioSchedules narrowed =
            spindle_waves(*capped, cluster.devices(), cluster.devices_per_island, request.start_early);
        add_groups(c, std::move(narrowed.schedules));
        if (narrowed.narrowed_tails && p.contraction.metaops.size() <= kMaxWideTailMetaOps)
          add_groups(c, spindle_waves(*capped, cluster.devices(), cluster.devices_per_island, request.start_early,
                                      false).schedules);
      }
      // And the allocation capped with each sum priced as if queued
      // (kQueuedSyncWeight): its first schedules, one more group, when its
      // caps differ from those above.
      if (const std::optional<Prepared> queued =
              request.comm_aware_candidates && request.queued_sync_candidates
                  ? comm_capped(p, request, kQueuedSyncWeight)
                  : std::nullopt;
          queued && queued->valid != (capped ? capped->valid : p.valid)) {
        std::vector<std::vector<AbstractWave>> schedules =
            spindle_waves(*queued, cluster.devices(), cluster.devices_per_island, request.start_early).schedules;
        if (schedules.size() > kCappedSchedules) schedules.resize(kCappedSchedules);
        add_groups(c, std::move(schedules));
      }
      c.own = c.waves.size();
      // The baselines' schedules are wave plans too: Spindle also places
      // and simulates them, so its plan is never predicted slower than a
      // baseline's (task-level wins on ofasys-7 with 32 and 64 devices,
      // where its small per-task groups all-reduce less).
      if (request.baseline_candidates) {
        std::vector<std::vector<AbstractWave>> baselines;
        baselines.push_back(sequential_waves(p, baseline));
        baselines.push_back(task_level_waves(baseline));
        baselines.push_back(intra_task_waves(baseline));
        for (std::vector<AbstractWave>& waves : baselines)
          if (slot_devices(waves) <= kMaxBaselineCandidateSlots) c.waves.push_back(std::move(waves));
      }
      break;
    }
    case Strategy::sequential: c.waves = {sequential_waves(p, baseline)}; break;
    case Strategy::task_level: c.waves = {task_level_waves(baseline)}; break;
    case Strategy::intra_task: c.waves = {intra_task_waves(baseline)}; break;
  }
  return c;
}

// A plan of `request` with its header and MetaOps filled in, no waves yet.
Plan plan_header(const PlanRequest& request, const Prepared& p) {
  const Model& model = *request.model;
  const Cluster& cluster = *request.cluster;
  Plan plan;
  plan.strategy = strategy_name(request.strategy);
  plan.model_name = model.name;
  plan.model_sha256 = model.sha256;
  plan.cluster_name = cluster.name;
  plan.devices = cluster.devices();
  plan.devices_per_island = cluster.devices_per_island;
  plan.memory_bytes = cluster.memory_bytes();
  plan.profile_sha256 = request.profile_sha256;
  plan.overlap = request.sync.overlap;
  plan.bucket_bytes = request.sync.bucket_bytes;
  plan.grad_norm = request.sync.grad_norm;
  plan.optimizer_state = request.optimizer_state;
  for (const MetaOp& m : p.contraction.metaops) {
    PlanMetaOp pm;
    pm.id = m.id;
    pm.task = model.tasks[static_cast<size_t>(m.task)].name;
    pm.workload = m.workload;
    pm.tensor_parallel = m.tensor_parallel;
    for (int o : m.operators) pm.operators.push_back(request.graph->ops[static_cast<size_t>(o)].id);
    pm.level = m.level;
    pm.inputs = m.inputs;
    plan.metaops.push_back(std::move(pm));
  }
  return plan;
}

// The SimOptions of simulate_candidate.
SimOptions candidate_options(const PlanRequest& request, double bound_ms, bool compute_only) {
  SimOptions options;
  options.timeline = false;
  options.price_communication = !compute_only;
  options.price_optimizer = !compute_only;
  options.stop_after_ms = bound_ms;
  options.sync = request.sync;
  return options;
}

// `candidate` simulated as the planner's objective by `simulation` (its
// lowering, made once for every simulation of it), stopping once it passes
// `bound_ms` (then its iteration_ms is infinity: it cannot win); with
// `compute_only`, communication and optimizer steps priced at 0
// (simulated_compute_gap's makespan).
Result<Simulation> simulate_candidate(PlanSimulation& simulation, const Plan& candidate, const PlanRequest& request,
                                      double bound_ms, bool compute_only = false) {
  Result<Simulation> sim = simulation.simulate(candidate_options(request, bound_ms, compute_only));
  if (!sim) return Error{"planner: simulating a " + candidate.strategy + " candidate: " + sim.error().message};
  return sim;
}

// The same, lowering `candidate` for this one simulation.
Result<Simulation> simulate_candidate(const Plan& candidate, const LowerContext& lowering,
                                      const PlanRequest& request, double bound_ms, bool compute_only = false) {
  PlanSimulation simulation(candidate, lowering, *request.cost, request.sync);
  return simulate_candidate(simulation, candidate, request, bound_ms, compute_only);
}

// a simulates faster than b by more than rounding (1e-12 relative).
bool faster(const Costed& a, const Costed& b) { return a.simulated_ms < b.simulated_ms * (1 - 1e-12); }

// Placement, then costing, of every candidate. Every placed candidate is
// costed by simulating its lowered programs (libplan/sim): the shortest
// simulated iteration wins (ties: the earlier candidate). Island placement
// refines itself (each pass knows where the previous one sent every slot's
// output): every schedule gets one pass (first_pass, on parallel threads:
// the candidates are independent), then each group's best schedules get the
// further passes (refine).
class CandidateSearch {
 public:
  CandidateSearch(const Candidates& candidates, const PlanRequest& request, const PlaceInput& in,
                  const LowerContext& lowering, const Plan& header)
      : c_(candidates), request_(request), in_(in), lowering_(lowering), costed_(candidates.waves.size()),
        scratch_(parallel_workers(candidates.waves.size()), header),
        seen_(static_cast<size_t>(candidates.groups())) {}

  // The first placement pass of every schedule, simulated with its buckets
  // started in order. Simulations are bounded by their group's
  // kRefinedSchedules-th best makespan any worker has finished: a candidate
  // stopped there has that many faster ones in its group, so each group's
  // best kRefinedSchedules are always simulated to the end, whichever
  // thread ran what.
  Status first_pass();
  // The further passes of each group's best kRefinedSchedules schedules
  // (after first_pass), side by side: the best schedule after one pass is
  // not always the best after three. Returns the fastest placement found.
  // `runner_up`, when given, gets the fastest placement of another group
  // than the winner's within kRunnerUpWithin of it, if any (else nullopt);
  // its simulations are then bounded that far above the best makespan so
  // far, so that every placement within it is simulated to the end.
  Result<Costed> refine(std::optional<Costed>* runner_up = nullptr);
  // Schedule `c`'s waves in `plan`, placed as `placed`.
  void emit(size_t c, const std::vector<WavePlacement>& placed, Plan& plan) const {
    emit_waves(c_.waves[c], placed, plan);
  }

 private:
  std::vector<WavePlacement> place(size_t c, const std::vector<WavePlacement>* hint) const {
    if (request_.placement == Placement::sequential) return place_sequential(c_.waves[c], in_.devices);
    return place_islands(c_.waves[c], in_, hint);
  }
  // Schedule c placed as `placed` in `scratch` (the plan's header and
  // MetaOps), its buckets started as `starts` says, simulated into `out`.
  Status evaluate(size_t c, std::vector<WavePlacement> placed, double bound_ms, Plan& scratch, Costed& out,
                  BucketStarts starts) const;
  // The best kRefinedSchedules of each group by their first pass.
  std::vector<size_t> refined_schedules() const;
  double group_bound(int g);

  const Candidates& c_;
  const PlanRequest& request_;
  const PlaceInput& in_;
  const LowerContext& lowering_;
  std::vector<Costed> costed_;     // by candidate: its first pass
  std::vector<Plan> scratch_;      // by worker
  std::mutex seen_mutex_;
  // Per group: the best makespans finished, ascending, at most kRefinedSchedules.
  std::vector<std::vector<double>> seen_;
};

Status CandidateSearch::evaluate(size_t c, std::vector<WavePlacement> placed, double bound_ms, Plan& scratch,
                                 Costed& out, BucketStarts starts) const {
  emit_waves(c_.waves[c], placed, scratch);
  scratch.bucket_starts = starts;
  SPINDLE_ASSIGN(sim, simulate_candidate(scratch, lowering_, request_, bound_ms));
  out.placed = std::move(placed);
  out.simulated_ms = sim.iteration_ms;
  out.starts = starts;
  out.starts_matter = sim.bucket_starts_matter;
  return {};
}

double CandidateSearch::group_bound(int g) {
  const std::lock_guard<std::mutex> lock(seen_mutex_);
  const std::vector<double>& best = seen_[static_cast<size_t>(g)];
  return best.size() < kRefinedSchedules ? std::numeric_limits<double>::infinity() : best.back();
}

Status CandidateSearch::first_pass() {
  const size_t n = c_.waves.size();
  std::vector<Status> status(n);
  // The threads take the schedules in this order: Spindle's own first (they
  // set the bound the others must beat), then the baselines' by their slot
  // count, most first (placing them is what costs; a long one taken last
  // would leave the other threads idle). Results stay by index.
  std::vector<size_t> run_order(n);
  std::iota(run_order.begin(), run_order.end(), size_t{0});
  std::stable_sort(run_order.begin() + static_cast<std::ptrdiff_t>(c_.own), run_order.end(),
                   [&](size_t a, size_t b) { return slot_count(c_.waves[a]) > slot_count(c_.waves[b]); });
  parallel_for(n, [&](size_t w, size_t k) {
    const size_t c = run_order[k];
    const int g = c_.group_of(c);
    status[c] = evaluate(c, place(c, nullptr), group_bound(g), scratch_[w], costed_[c], BucketStarts::in_order);
    if (!status[c].ok()) return;
    const double ms = costed_[c].simulated_ms;
    const std::lock_guard<std::mutex> lock(seen_mutex_);
    std::vector<double>& best = seen_[static_cast<size_t>(g)];
    best.insert(std::upper_bound(best.begin(), best.end(), ms), ms);
    if (best.size() > kRefinedSchedules) best.pop_back();
  });
  for (const Status& st : status) SPINDLE_TRY(st);
  return {};
}

// Each group's schedules in order of their first pass, compared exactly
// (ties: the earlier), not within `faster`'s tolerance: which candidates
// stopped at their bound depends on the threads' timing, and only an exact
// order keeps every one of them behind the schedules kept (a stopped one is
// slower, exactly, than kRefinedSchedules others of its group).
std::vector<size_t> CandidateSearch::refined_schedules() const {
  std::vector<size_t> order;
  for (int g = 0; g < c_.groups(); ++g) {
    std::vector<size_t> mine;
    for (size_t c = 0; c < c_.waves.size(); ++c)
      if (c_.group_of(c) == g) mine.push_back(c);
    std::stable_sort(mine.begin(), mine.end(),
                     [&](size_t a, size_t b) { return costed_[a].simulated_ms < costed_[b].simulated_ms; });
    order.insert(order.end(), mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(std::min(mine.size(), kRefinedSchedules)));
  }
  return order;
}

// Every placement refined is simulated with its gradient buckets started in
// order and started when ready (Plan::bucket_starts), the faster kept:
// neither wins everywhere (multitask-clip-10 on a800-4x8: 204.9 ms in
// order, 198.9 when ready; qwen-val-3 there: 916.8 and 964.9). Trying both
// on every first pass too would cost a third more planning time.
Result<Costed> CandidateSearch::refine(std::optional<Costed>* runner_up) {
  const std::vector<size_t> order = refined_schedules();
  std::vector<Costed> refined(order.size());
  std::vector<Status> status(order.size());
  // Run fastest first pass first: the best makespan found so far (`best`,
  // over every chain) bounds every later simulation, so the sooner it is
  // low, the sooner the others stop. A simulation slower than it cannot
  // make its chain the winner (the winner is at most as slow), so the
  // bound changes no result, whichever thread finishes what first; its
  // margin keeps every near-tie that `faster` would weigh simulated to
  // the end.
  std::vector<size_t> run_order(order.size());
  std::iota(run_order.begin(), run_order.end(), size_t{0});
  std::stable_sort(run_order.begin(), run_order.end(), [&](size_t a, size_t b) {
    return costed_[order[a]].simulated_ms < costed_[order[b]].simulated_ms;
  });
  std::mutex best_mutex;
  double best = std::numeric_limits<double>::infinity();   // every chain starts at its first pass
  for (size_t c : order) best = std::min(best, costed_[c].simulated_ms);
  auto bound = [&](double own) {
    const std::lock_guard<std::mutex> lock(best_mutex);
    return std::min(own, best * (1 + (runner_up ? kRunnerUpWithin : 1e-9)));
  };
  parallel_for(order.size(), [&](size_t w, size_t i) {
    const size_t k = run_order[i];
    const size_t c = order[k];
    refined[k] = costed_[c];
    // Placement `placed` simulated in order (unless that is done:
    // `starts_matter` holds what its simulation said), then when ready
    // unless the two rules lower the same programs; the best kept. No more
    // workers than first_pass has scratch plans for.
    auto try_starts = [&](const std::vector<WavePlacement>& placed, std::optional<bool> starts_matter) {
      auto keep = [&](BucketStarts starts) {
        Costed again;
        status[k] = evaluate(c, placed, bound(refined[k].simulated_ms), scratch_[w], again, starts);
        const bool matter = again.starts_matter;
        if (status[k].ok() && faster(again, refined[k])) refined[k] = std::move(again);
        const std::lock_guard<std::mutex> lock(best_mutex);
        best = std::min(best, refined[k].simulated_ms);
        return matter;
      };
      if (!starts_matter) starts_matter = keep(BucketStarts::in_order);
      if (status[k].ok() && request_.sync.overlap && *starts_matter) keep(BucketStarts::when_ready);
      return status[k].ok();
    };
    std::vector<WavePlacement> placed = costed_[c].placed;
    if (!try_starts(placed, costed_[c].starts_matter)) return;
    if (request_.placement != Placement::islands) return;
    for (int pass = 1; pass < kPlacementPasses; ++pass) {
      std::vector<WavePlacement> next = place(c, &placed);
      if (next == placed) break;  // a fixed point: further passes repeat it
      placed = std::move(next);
      if (!try_starts(placed, std::nullopt)) return;
    }
  });
  for (const Status& st : status) SPINDLE_TRY(st);
  size_t win = 0;
  for (size_t k = 1; k < refined.size(); ++k)
    if (faster(refined[k], refined[win])) win = k;
  refined[win].schedule = order[win];
  if (runner_up) {
    // A bound of the winner's makespan x (1 + kRunnerUpWithin) or more
    // stopped none of these (the best so far is never below the winner's):
    // which placement that is does not depend on the threads.
    runner_up->reset();
    const int g = c_.group_of(order[win]);
    for (size_t k = 0; k < refined.size(); ++k)
      if (c_.group_of(order[k]) != g && refined[k].simulated_ms <= refined[win].simulated_ms * (1 + kRunnerUpWithin) &&
          (!*runner_up || faster(refined[k], **runner_up))) {
        *runner_up = refined[k];
        (*runner_up)->schedule = order[k];
      }
  }
  return std::move(refined[win]);
}

void flip_bucket_starts(Plan& p) { p.bucket_starts = other_rule(p.bucket_starts); }
void flip_transfers(Plan& p) { p.early_transfers = !p.early_transfers; }
void flip_param_gather(Plan& p) {
  p.param_gather = p.param_gather == ParamGather::next_step ? ParamGather::after_step : ParamGather::next_step;
}

// One of a plan's lowering choices flipped (`change`), tried only where
// `applies` holds for the plan it would be tried on.
struct Flip {
  void (*change)(Plan&);
  bool (*applies)(const Plan&, const PlanRequest&);
};
bool always(const Plan&, const PlanRequest&) { return true; }
bool gather_applies(const Plan& p, const PlanRequest& r) { return param_gather_applies(p, r.sync); }
bool transfers_apply(const Plan&, const PlanRequest& r) { return r.sync.overlap && r.sync.early_transfers; }

// Each of `flips` in order applied to a copy of `plan` and kept when that
// simulates faster than `simulated_ms` (then updated), each tried on the
// plan the ones before it left. The flips not yet tried are simulated side
// by side on the plan as it stands (a flip before the first kept one
// changed nothing), and those after a kept one again on the plan it left:
// the plan and makespan of trying them one after another. Returns, by
// flip, whether it was kept.
Result<std::vector<bool>> keep_each_if_faster(Plan& plan, double& simulated_ms, const std::vector<Flip>& flips,
                                              const LowerContext& lowering, const PlanRequest& request) {
  std::vector<bool> kept(flips.size(), false);
  for (size_t from = 0; from < flips.size();) {
    std::vector<size_t> tried;
    for (size_t i = from; i < flips.size(); ++i)
      if (flips[i].applies(plan, request)) tried.push_back(i);
    std::vector<Plan> other(tried.size(), plan);
    std::vector<Result<Simulation>> sim(tried.size(), Error{"not simulated"});
    parallel_for(tried.size(), [&](size_t, size_t k) {
      flips[tried[k]].change(other[k]);
      sim[k] = simulate_candidate(other[k], lowering, request, simulated_ms);
    });
    from = flips.size();
    for (size_t k = 0; k < tried.size(); ++k) {
      if (!sim[k]) return sim[k].error();
      if (sim[k]->iteration_ms >= simulated_ms * (1 - 1e-12)) continue;
      plan = std::move(other[k]);
      simulated_ms = sim[k]->iteration_ms;
      kept[tried[k]] = true;
      from = tried[k] + 1;
      break;
    }
  }
  return kept;
}

// Transfers posted early or in their exchanges (Plan::early_transfers): the
// winner `plan` (simulating in `simulated_ms`) tries the other way too, the
// faster kept. Posting early usually wins, but devices that move on sooner
// also start their all-reduces in another order (qwen-val-3 on a800-4x8:
// 916.8 ms posted early, 801.2 in the exchanges). --no-early-transfers: in
// the exchanges. Returns the plan's simulated makespan.
Result<double> choose_transfers(Plan& plan, double simulated_ms, const LowerContext& lowering,
                                const PlanRequest& request) {
  plan.early_transfers = request.sync.early_transfers;
  // ZeRO-1's all-gathers at the next step's start or after the step
  // (Plan::param_gather): neither wins everywhere (multitask-clip-10
  // sharded on a800-8x8 is faster gathering after the step, qwen-val-3 on
  // a800-1x8 at the next step's start). Then the transfers.
  SPINDLE_ASSIGN(kept, keep_each_if_faster(plan, simulated_ms,
                                           {{flip_param_gather, gather_applies}, {flip_transfers, transfers_apply}},
                                           lowering, request));
  // Its bucket starts were chosen with early transfers: the other rule
  // again, so that the plan's is the faster with its transfers.
  if (kept[1])
    SPINDLE_TRY(keep_each_if_faster(plan, simulated_ms, {{flip_bucket_starts, always}}, lowering, request));
  return simulated_ms;
}

// The plan's lowering choices (Plan::bucket_starts, chosen by
// CandidateSearch, Plan::early_transfers and, sharded, Plan::param_gather,
// by choose_transfers) made again after its waves changed: any rule
// flipped while that simulates faster. Returns the plan's simulated
// makespan.
Result<double> rechoose_lowering(Plan& plan, double simulated_ms, const LowerContext& lowering,
                                 const PlanRequest& request) {
  if (!request.sync.overlap) return simulated_ms;
  const std::vector<Flip> flips = {
      {flip_bucket_starts, always}, {flip_transfers, transfers_apply}, {flip_param_gather, gather_applies}};
  for (bool again = true; again;) {
    SPINDLE_ASSIGN(kept, keep_each_if_faster(plan, simulated_ms, flips, lowering, request));
    again = std::find(kept.begin(), kept.end(), true) != kept.end();
  }
  return simulated_ms;
}

// `plan` costed by the wave-barrier model (cost_plan: parameter groups,
// memory, the predicted parts), its simulated makespan and relaxed optimum
// kept as given.
void cost_winner(Plan& plan, double simulated_ms, double relaxed_optimum_ms, const PlanRequest& request) {
  cost_plan(plan, cost_tables(plan, *request.model, *request.graph, *request.cost), *request.cost);
  plan.predicted.simulated_ms = simulated_ms;
  plan.predicted.relaxed_optimum_ms = relaxed_optimum_ms;
}

// The best bucket cap for `plan`, which simulates in `simulated_ms` with
// request.sync's cap, and its makespan: each of kBucketCapsMb (ascending)
// simulated side by side, each bounded by `simulated_ms` and `bound_ms`
// (a cap that cannot beat either does not count); the fastest, ties to
// the smaller cap. Without a faster one: request.sync's, `simulated_ms`.
struct CapChoice {
  int64_t bytes = 0;
  double ms = 0;
};
Result<CapChoice> best_bucket_cap(const Plan& plan, double simulated_ms, const LowerContext& lowering,
                                  const PlanRequest& request,
                                  double bound_ms = std::numeric_limits<double>::infinity()) {
  const double bound = std::min(simulated_ms, bound_ms) * (1 + 1e-9);
  constexpr size_t n = std::size(kBucketCapsMb);
  std::vector<Result<double>> ms(n, Result<double>(simulated_ms));
  parallel_for(n, [&](size_t, size_t k) {
    PlanRequest with = request;   // the simulation lowers with its sync
    with.sync.bucket_bytes = bucket_bytes_of_mb(kBucketCapsMb[k]);
    if (with.sync.bucket_bytes == request.sync.bucket_bytes) return;
    Result<Simulation> sim = simulate_candidate(plan, lowering, with, bound);
    ms[k] = sim ? Result<double>(sim->iteration_ms) : Result<double>(sim.error());
  });
  CapChoice best{request.sync.bucket_bytes, simulated_ms};
  for (size_t k = 0; k < n; ++k) {
    if (!ms[k]) return ms[k].error();
    const int64_t bytes = bucket_bytes_of_mb(kBucketCapsMb[k]);
    if (*ms[k] < best.ms * (1 - 1e-12) || (*ms[k] <= best.ms * (1 + 1e-12) && bytes < best.bytes))
      best = {bytes, std::min(best.ms, *ms[k])};
  }
  return best;
}

// make_plan on the request's cluster alone; an error when its compute alone
// (work_bound_ms x `packing` >= 1) cannot beat `beat_ms` (the caller has a
// plan that fast).
// Candidates are not bounded by beat_ms: a first placement pass slower than
// it may refine to a faster plan, and the plan must be the one make_plan
// gives on this cluster.
Result<Plan> plan_on_cluster(const PlanRequest& request, const LowerContext& lowering, double beat_ms,
                             double packing, std::optional<Plan>* runner_up = nullptr) {
  const auto start = std::chrono::steady_clock::now();
  const Cluster& cluster = *request.cluster;
  if (cluster.devices() < 1)
    return Error{"cluster '" + cluster.name + "' has no devices"};

  SPINDLE_ASSIGN(p, prepare(request));
  if (const double bound = work_bound_ms(p, cluster.devices()) * packing; bound >= beat_ms)
    return Error{"planner: on " + std::to_string(cluster.devices()) + " devices the compute alone takes about " +
                 std::to_string(bound) + " ms"};

  Plan plan = plan_header(request, p);
  const Candidates candidates = strategy_candidates(p, request);
  const PlaceInput in = placement_input(p.contraction, request);
  CandidateSearch search(candidates, request, in, lowering, plan);
  SPINDLE_TRY(search.first_pass());
  // A runner-up only where the shifts will run (kRunnerUpWithin).
  const bool with_runner_up = runner_up && request.strategy == Strategy::spindle && request.shift_simulations > 0;
  std::optional<Costed> other;
  SPINDLE_ASSIGN(best, search.refine(with_runner_up ? &other : nullptr));
  // A placement made a plan: its waves and bucket starts, the lowering
  // choices made; its simulated makespan.
  auto make = [&](Plan& x, const Costed& c) {
    search.emit(c.schedule, c.placed, x);
    x.bucket_starts = c.starts;
    return choose_transfers(x, c.simulated_ms, lowering, request);
  };
  if (runner_up) runner_up->reset();
  if (other) {
    Plan& up = runner_up->emplace(plan);
    SPINDLE_ASSIGN(up_ms, make(up, *other));
    cost_winner(up, up_ms, p.relaxed_optimum_ms, request);
  }
  SPINDLE_ASSIGN(simulated_ms, make(plan, best));
  // Still within kRunnerUpWithin of the winner with both their transfers
  // and gathers chosen, else not shifted.
  if (runner_up && *runner_up && (*runner_up)->predicted.simulated_ms > simulated_ms * (1 + kRunnerUpWithin))
    runner_up->reset();

  // The winner alone is also costed by the wave-barrier model.
  cost_winner(plan, simulated_ms, p.relaxed_optimum_ms, request);
  plan.planning_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

// make_plan, or an error when it cannot beat `beat_ms` (plan_on_cluster).
//
// Spindle on a cluster of kFewerIslandsFrom islands or more also plans on
// its first half of the islands, then on the half of that, ...: when a
// share simulates faster (its all-reduce groups spread over fewer
// islands), it is the plan, the other devices idle. So more islands do
// not make Spindle's plan slower (multitask-clip-10, batch fixed: 8
// islands of 8 A800s are as fast as Spindle gets; 16 or 128 islands only
// spread the same work's gradient sums wider). The halving stops at a
// share more than kHalvingSlack slower than the best plan so far: its
// halves are not planned (50 tasks on 1024 devices: 64 islands 29% slower
// than 128, and planning 32 islands after them cost 16% of the planning,
// for a plan slower still; docs/planner.md, "Fewer islands").
Result<Plan> plan_beating(const PlanRequest& request, const LowerContext& lowering, double beat_ms,
                          double packing, std::optional<Plan>* runner_up = nullptr) {
  const auto start = std::chrono::steady_clock::now();
  Result<Plan> plan = plan_on_cluster(request, lowering, beat_ms, packing, runner_up);
  if (!plan || request.strategy != Strategy::spindle || !request.fewer_islands ||
      request.cluster->islands < kFewerIslandsFrom)
    return plan;
  auto fits = [&](const Plan& x) { return check_plan_memory(x, *request.model).ok(); };
  Plan& best = *plan;
  const double relaxed_optimum_ms = best.predicted.relaxed_optimum_ms;   // the whole cluster's
  std::deque<Cluster> shares;     // the halves planned (stable: requests point at them)
  PlanRequest last = request;     // the share planned last; its half is next
  bool on_share = false;          // the best plan is on a half, not the whole
  // The best plan's makespan at its best bucket cap (when make_plan will
  // choose one): wider all-reduces gain the most from larger buckets (16
  // islands of the 10-task CLIP beat 8 with the caps, 209.4 against 224.0
  // ms, and lost with 25 MiB); each plan keeps the request's cap, and
  // make_plan chooses again.
  auto at_best_cap = [&](const Plan& x, const PlanRequest& on, double bound_ms) -> Result<double> {
    if (!request.choose_bucket_bytes) return x.predicted.simulated_ms;
    SPINDLE_ASSIGN(cap, best_bucket_cap(x, x.predicted.simulated_ms, lowering, on, bound_ms));
    return cap.ms;
  };
  double best_ms = 0;                  // at_best_cap of `best`, once a half is planned
  std::vector<Plan::Share> shares_planned;   // the whole first, once a half is planned
  // The compute gap of the plan on `last` (to its relaxed optimum).
  auto gap_of = [](const Plan& x) {
    return x.predicted.relaxed_optimum_ms > 0 ? x.predicted.compute_ms / x.predicted.relaxed_optimum_ms - 1.0 : 0.0;
  };
  double last_gap = gap_of(best);
  while (last.cluster->islands >= kFewerIslandsFrom) {
    Cluster& half = shares.emplace_back(*last.cluster);
    half.islands /= 2;
    PlanRequest on_half = last;
    on_half.cluster = &half;
    // Skipped when its compute alone, packed no better than the share
    // before it packs its own (its compute gap to the relaxed optimum, at
    // most kMaxPackingSlack), cannot beat both the best plan and the
    // caller's: a heuristic, so that a cluster whose plan is compute-bound
    // (1000 tasks on 1024 devices) is not planned again on a half; a plan
    // slowed by its all-reduces always is.
    std::optional<Plan> smaller_up;
    Result<Plan> smaller = plan_on_cluster(on_half, lowering, std::min(beat_ms, best.predicted.simulated_ms),
                                           1.0 + std::clamp(last_gap, 0.0, kMaxPackingSlack),
                                           runner_up ? &smaller_up : nullptr);
    if (!smaller) break;
    if (shares_planned.empty()) {   // the whole's cap, needed only now (pruned halves cost no simulation)
      SPINDLE_ASSIGN(whole_ms, at_best_cap(best, request, std::numeric_limits<double>::infinity()));
      best_ms = whole_ms;
      shares_planned.push_back({request.cluster->islands, best_ms});
    }
    SPINDLE_ASSIGN(smaller_ms, at_best_cap(*smaller, on_half, best_ms));
    shares_planned.push_back({half.islands, smaller_ms});
    last = on_half;
    last_gap = gap_of(*smaller);
    if (smaller_ms < best_ms * (1 - 1e-12) && (fits(*smaller) || !fits(best))) {
      best = std::move(*smaller);
      best_ms = smaller_ms;
      on_share = true;
      if (runner_up) *runner_up = std::move(smaller_up);
    } else if (smaller_ms > best_ms * (1 + kHalvingSlack)) {
      break;
    }
  }
  if (on_share) {
    // The same waves, on the whole cluster's header; its costing redone
    // there (the simulation is the same: idle devices change nothing), with
    // the whole cluster's relaxed optimum.
    const Cluster& cluster = *request.cluster;
    auto on_whole = [&](Plan& x) {
      x.cluster_name = cluster.name;
      x.devices = cluster.devices();
      x.devices_per_island = cluster.devices_per_island;
      x.memory_bytes = cluster.memory_bytes();
      cost_winner(x, x.predicted.simulated_ms, relaxed_optimum_ms, request);
    };
    on_whole(best);
    if (runner_up && *runner_up) on_whole(**runner_up);
  }
  best.shares_planned = std::move(shares_planned);
  best.planning_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

// Boundary shifts on the winner `plan` of `request` (docs/planner.md,
// step 9), on whichever cluster share it won on, then its lowering choices
// made again. Returns its simulated makespan.
Result<double> shift_winner(Plan& plan, const LowerContext& lowering, const PlanRequest& request) {
  auto simulate = [&](const Plan& shifted, double bound_ms, double compute_bound_ms) -> Result<ShiftTimes> {
    PlanSimulation simulation(shifted, lowering, *request.cost, request.sync);
    ShiftTimes times;
    SPINDLE_ASSIGN(compute, simulate_candidate(simulation, shifted, request, compute_bound_ms, true));
    times.compute_ms = compute.iteration_ms;
    times.ms = std::numeric_limits<double>::infinity();
    if (times.compute_ms > compute_bound_ms) return times;
    SPINDLE_ASSIGN(sim, simulate_candidate(simulation, shifted, request, bound_ms));
    times.ms = sim.iteration_ms;
    return times;
  };
  const ShiftFits fits =
      shift_memory_fits(cost_tables(plan, *request.model, *request.graph, *request.cost), *request.cost, *request.model);
  const int budget = shift_budget(plan, request.shift_simulations);
  ShiftTimes times{plan.predicted.simulated_ms, 0.0};
  if (budget > 0) {
    SPINDLE_ASSIGN(compute, simulate_candidate(plan, lowering, request, std::numeric_limits<double>::infinity(), true));
    times.compute_ms = compute.iteration_ms;
  }
  SPINDLE_ASSIGN(shifted_ms, shift_boundaries(plan, times, budget, simulate, fits));
  return rechoose_lowering(plan, shifted_ms, lowering, request);
}

// `plan` (fitting the devices with its optimizer state replicated) with
// the state sharded instead, its values gathered after the step and at
// the next step's start (Plan::param_gather): the faster of those when it
// simulates faster than `plan` (with `always`, however fast), which it
// then replaces (recosted: less memory). A reduce-scatter takes half an
// all-reduce's time at the end of the backward pass, and the all-gather
// may hide behind the next step's forwards. Only the winner is simulated
// again (two simulations, and its lowering choices again when it is
// sharded), not planned again. Returns the faster sharded simulation over
// `plan`'s replicated one (below 1, or with `always`: it replaced `plan`).
Result<double> shard_if_faster(Plan& plan, PlanRequest request, const LowerContext& lowering, bool always = false) {
  request.optimizer_state = OptimizerState::sharded;
  request.placement_state.reset();
  request.sync.overlap = plan.overlap;
  request.sync.bucket_bytes = plan.bucket_bytes;
  request.sync.grad_norm = plan.grad_norm;
  const double replicated_ms = plan.predicted.simulated_ms;
  double best_ms = always ? std::numeric_limits<double>::infinity() : replicated_ms;
  double sharded_ms = std::numeric_limits<double>::infinity();
  std::optional<Plan> best;
  std::vector<Plan> sharded;
  for (ParamGather gather : {ParamGather::after_step, ParamGather::next_step}) {
    sharded.push_back(plan);
    sharded.back().optimizer_state = OptimizerState::sharded;
    sharded.back().param_gather = gather;
    if (!param_gather_applies(sharded.back(), request.sync)) break;   // the other gather lowers the same
  }
  // Side by side, each bounded a little past the replicated figure: how
  // close it comes decides whether auto searches sharded too (make_plan).
  // The second is not bounded by the first's makespan as well: where the
  // first stops it, the second's figure is above the first's, which neither
  // the minimum nor the faster plan below takes.
  std::vector<Result<Simulation>> sims(sharded.size(), Error{"not simulated"});
  const double bound_ms = always ? std::numeric_limits<double>::infinity() : replicated_ms * (1 + kShardedSearchWithin);
  parallel_for(sharded.size(), [&](size_t, size_t k) {
    sims[k] = simulate_candidate(sharded[k], lowering, request, bound_ms);
  });
  for (size_t k = 0; k < sharded.size(); ++k) {
    if (!sims[k]) return sims[k].error();
    sharded_ms = std::min(sharded_ms, sims[k]->iteration_ms);
    if (sims[k]->iteration_ms < best_ms * (1 - 1e-12)) {
      best_ms = sims[k]->iteration_ms;
      best = std::move(sharded[k]);
    }
  }
  const double ratio = sharded_ms / replicated_ms;
  if (!best) return ratio;
  // Its other lowering choices were made replicated: made again.
  SPINDLE_ASSIGN(again_ms, rechoose_lowering(*best, best_ms, lowering, request));
  best_ms = again_ms;
  cost_winner(*best, best_ms, plan.predicted.relaxed_optimum_ms, request);
  best->planning_ms = plan.planning_ms;
  best->sharded_because = Plan::ShardedBecause::faster;
  best->replicated_ms = plan.predicted.simulated_ms;
  plan = std::move(*best);
  return ratio;
}

// The boundary shifts (Spindle's plans) and the bucket cap of `plan`, the
// winner of plan_beating or its runner-up, with the lowering choices made
// again after each; returns its simulated makespan.
Result<double> finish_plan(Plan& plan, const PlanRequest& given, const LowerContext& lowering) {
  PlanRequest request = given;   // its bucket cap, once chosen
  const bool shifts = request.strategy == Strategy::spindle && request.shift_simulations > 0;
  double simulated_ms = plan.predicted.simulated_ms;
  if (shifts) {
    SPINDLE_ASSIGN(shifted_ms, shift_winner(plan, lowering, request));
    simulated_ms = shifted_ms;
  }
  // Then its bucket cap (every strategy), and with a new one the lowering
  // choices again. Chosen after the shifts, which ran with the request's
  // cap: so the plan is never slower than with that cap alone. (Chosen
  // before them instead, multitask-clip-10 on a800-8x8 ended 0.6% faster
  // still, 161.1 against 162.0 ms, but multitask-clip-7 on a800-2x8 2%
  // slower than with 25 MiB: the shifts took another path; docs/planner.md,
  // "Bucket cap".)
  if (request.choose_bucket_bytes) {
    SPINDLE_ASSIGN(cap, best_bucket_cap(plan, simulated_ms, lowering, request));
    simulated_ms = cap.ms;
    if (cap.bytes != request.sync.bucket_bytes) {
      plan.bucket_bytes = request.sync.bucket_bytes = cap.bytes;
      SPINDLE_ASSIGN(again_ms, rechoose_lowering(plan, simulated_ms, lowering, request));
      simulated_ms = again_ms;
    }
  }
  return simulated_ms;
}

// make_plan with the optimizer state as `given` holds it
// (choose_optimizer_state aside), `lowering` made once by the caller, its
// planning time counted from `start`.
Result<Plan> plan_state(const PlanRequest& given, const LowerContext& lowering,
                        std::chrono::steady_clock::time_point start) {
  std::optional<Plan> runner_up;
  SPINDLE_ASSIGN(plan, plan_beating(given, lowering, std::numeric_limits<double>::infinity(), 1.0, &runner_up));
  const bool shifts = given.strategy == Strategy::spindle && given.shift_simulations > 0;
  if (!shifts && !given.choose_bucket_bytes) return plan;
  SPINDLE_ASSIGN(ms, finish_plan(plan, given, lowering));
  cost_winner(plan, ms, plan.predicted.relaxed_optimum_ms, given);
  // The runner-up of the candidate search (kRunnerUpWithin), shifted and
  // capped as well: kept when it simulates faster, and fits when the
  // winner does (as a share of the islands is, plan_beating).
  if (runner_up) {
    SPINDLE_ASSIGN(up_ms, finish_plan(*runner_up, given, lowering));
    cost_winner(*runner_up, up_ms, runner_up->predicted.relaxed_optimum_ms, given);
    if (up_ms < ms * (1 - 1e-12) &&
        (check_plan_memory(*runner_up, *given.model).ok() || !check_plan_memory(plan, *given.model).ok()))
      plan = std::move(*runner_up);
  }
  plan.planning_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

// One strategy planned (make_plan, before its fallback for memory).
Result<Plan> plan_one(const PlanRequest& given) {
  const auto start = std::chrono::steady_clock::now();
  if (!given.model || !given.graph || !given.cluster || !given.cost)
    return Error{"make_plan: model, graph, cluster and cost model are all required"};
  // What every candidate's lowering shares, worked out once.
  const Result<LowerContext> context = lower_context(*given.model, *given.graph);
  if (!context) return Error{"planner: " + context.error().message};
  if (!given.choose_optimizer_state) return plan_state(given, *context, start);
  // Replicated when that fits (no all-gathers), unless the same plan
  // simulates faster sharded; else sharded; when neither fits, the sharded
  // plan (the smaller) for the caller's memory check to report.
  PlanRequest as = given;
  as.choose_optimizer_state = false;
  as.optimizer_state = OptimizerState::replicated;
  as.placement_state = OptimizerState::sharded;
  Result<Plan> whole = plan_state(as, *context, start);
  auto since_start = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  // Fitting is by the plan's own count (rule 6), and also as spindle-run
  // holds the plan on GPUs where sharding the state is what makes it fit
  // there (sharding_fits_on_gpus; multitask-clip-10 on a800-1x8: about
  // 65 GiB counted, 85 held of 80 replicated, 79.0 sharded): spindle-run
  // would refuse the replicated plan. Where the same waves are over
  // sharded too, their activations are too large, not the state: the
  // decision stays the count's (ofasys-7 on a800-1x8: 94.3 GiB held
  // replicated, 93.1 sharded; a second search would not make a plan that
  // runs). Asked
  // only of models of at most sharded_search_metaops MetaOps, as the
  // sharded search below: on the 1000-task case the two figures take 0.3 s
  // of about 5 (a larger model gets spindle-plan's hint instead).
  const bool counted_fits = whole && check_plan_memory(*whole, *given.model).ok();
  const bool small_enough =
      whole && whole->metaops.size() <= static_cast<size_t>(std::max(0, given.sharded_search_metaops));
  const bool shard_to_run =
      counted_fits && small_enough &&
      sharding_fits_on_gpus(*whole, *given.model, *given.graph, std::nullopt, &*context).has_value();
  if (counted_fits && !shard_to_run) {
    const double replicated_ms = whole->predicted.simulated_ms;
    SPINDLE_ASSIGN(ratio, shard_if_faster(*whole, as, *context));
    // Within kShardedSearchWithin of it sharded as it stands: a search
    // with the state sharded may find a plan faster still (placement and
    // the shifts then weigh the reduce-scatters and the optimizer's
    // halves), which replaces it. Exactly as fast: sharding changes
    // nothing here (no bucket of two members, no parameters), and the
    // search would price what this one did.
    if (ratio <= 1 + kShardedSearchWithin && ratio != 1.0 && small_enough) {
      PlanRequest sharded_request = as;
      sharded_request.optimizer_state = OptimizerState::sharded;
      sharded_request.placement_state.reset();
      Result<Plan> sharded = plan_state(sharded_request, *context, start);
      if (!sharded) return sharded;
      // Kept when it simulates faster and its compute alone (communication
      // and optimizer steps priced at 0: simulated_compute_gap, the same
      // relaxed optimum for both) is no slower either: the boundary shifts'
      // rule (shift.h). Faster only by its communication while slower by
      // its compute, it would be a bet on the less certain of the two
      // predictions (bench/README.md, loop). On bench/paper's cases that
      // kept multitask-clip-7 on a800-1x8 and ofasys-7 on a800-2x8
      // replicated, 0.5-1.6% slower, ofasys-7's compute gap 2.98% instead
      // of 3.95% (docs/planner.md, "Memory"; multitask-clip-10 on a800-1x8
      // too).
      bool better = sharded->predicted.simulated_ms < whole->predicted.simulated_ms * (1 - 1e-12);
      if (better) {
        SPINDLE_ASSIGN(first_gap, simulated_compute_gap(*whole, *context, *given.cost));
        SPINDLE_ASSIGN(second_gap, simulated_compute_gap(*sharded, *context, *given.cost));
        better = 1 + second_gap <= (1 + first_gap) * (1 + 1e-9);
      }
      if (better) {
        sharded->sharded_because = Plan::ShardedBecause::faster;
        sharded->replicated_ms = replicated_ms;
        whole = std::move(sharded);
      }
    }
    whole->planning_ms = since_start();
    return whole;
  }
  as.optimizer_state = OptimizerState::sharded;
  as.placement_state.reset();
  Result<Plan> sharded = plan_state(as, *context, start);
  if (shard_to_run) {
    // The search places the waves again, and its plan may be over on GPUs
    // where the same waves sharded were not (multitask-clip-7 on 32 devices
    // of 26 GiB: 29.8 GiB against 24.1), or fail: those waves sharded, when the
    // search's plan is over, slower or missing.
    Plan same = *whole;
    SPINDLE_TRY(shard_if_faster(same, as, *context, /*always*/ true));
    const bool search_fits = sharded && fits_on_gpus(*sharded, *given.model, *given.graph, &*context);
    if (!search_fits || same.predicted.simulated_ms < sharded->predicted.simulated_ms * (1 - 1e-12))
      sharded = std::move(same);
    sharded->planning_ms = since_start();
  }
  if (sharded)
    sharded->sharded_because =
        shard_to_run ? Plan::ShardedBecause::does_not_fit_as_run : Plan::ShardedBecause::does_not_fit;
  return sharded || !whole ? sharded : whole;
}

}  // namespace

Result<Plan> make_plan(const PlanRequest& given) {
  const auto start = std::chrono::steady_clock::now();
  Result<Plan> own = plan_one(given);
  if (!own || given.strategy != Strategy::spindle || check_plan_memory(*own, *given.model).ok()) return own;
  // Over memory: Spindle's search chose by time alone, and a baseline's
  // schedule (one of its candidates) may fit where its own do not
  // (multitask-clip-4 on 8 devices of 40 GiB: Spindle's fastest 48.4 GiB,
  // sequential's 38.5). The fastest baseline plan that fits, kept as
  // Spindle's, rather than a refusal; none: Spindle's own, for the caller's
  // memory check to report.
  std::optional<Plan> fitting;
  for (Strategy s : {Strategy::sequential, Strategy::task_level, Strategy::intra_task}) {
    PlanRequest as = given;
    as.strategy = s;
    Result<Plan> baseline = plan_one(as);
    if (!baseline || !check_plan_memory(*baseline, *given.model).ok()) continue;
    if (!fitting || baseline->predicted.simulated_ms < fitting->predicted.simulated_ms * (1 - 1e-12))
      fitting = std::move(*baseline);
  }
  if (!fitting) return own;
  const std::vector<int64_t>& own_bytes = own->predicted.memory_bytes;
  fitting->fitted_from = Plan::FittedFrom{
      fitting->strategy, own_bytes.empty() ? 0 : *std::max_element(own_bytes.begin(), own_bytes.end())};
  fitting->strategy = strategy_name(Strategy::spindle);
  fitting->planning_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return std::move(*fitting);
}

Result<double> width_optimum_ms(const Plan& plan, const CostModel& cost) {
  std::vector<int> widest(plan.metaops.size(), 0);
  for (const Wave& w : plan.waves)
    for (const Slice& s : w.slices) {
      int& n = widest[static_cast<size_t>(s.metaop)];
      n = std::max(n, static_cast<int>(s.devices.size()));
    }
  std::map<int, std::vector<AllocItem>> levels;   // MetaLevel -> its MetaOps, ascending id
  for (const PlanMetaOp& m : plan.metaops) {
    const ScalingCurve* curve = cost.curve(m.workload);
    if (curve == nullptr) return Error{"no scaling curve for workload " + m.workload.key()};
    if (widest[static_cast<size_t>(m.id)] == 0) return Error{"MetaOp " + std::to_string(m.id) + " has no slice"};
    levels[m.level].push_back({static_cast<int>(m.operators.size()), curve, widest[static_cast<size_t>(m.id)]});
  }
  double sum = 0;
  for (const auto& [level, items] : levels)
    sum += relaxed_bound_ms(items, plan.devices, relax_level(items, plan.devices));
  return sum;
}

int comm_aware_cap(int length, const ScalingCurve& curve, const std::vector<int>& valid, int tensor_parallel,
                   double grad_bytes, const CostModel& cost, bool gather) {
  int best = valid.front();
  double best_ms = std::numeric_limits<double>::infinity();
  std::vector<int> replicas;
  for (int n : valid) {
    // Gradients are summed over the data-parallel replicas of each TP
    // rank (rules/rows.h): TP rank 0's, in a block of n devices from an
    // island's start, as placement packs them.
    const RowLayout layout{0, n, tensor_parallel};   // rows do not matter here
    replicas.clear();
    for (int i = 0; i < n; ++i)
      if (layout.tp_rank_of(i) == 0) replicas.push_back(i);
    // Sharded (ZeRO-1): a reduce-scatter and an all-gather of the values.
    const double ms = length * curve.time_ms(n) + (gather ? cost.reduce_scatter_ms(grad_bytes, replicas) +
                                                                cost.allgather_ms(grad_bytes, replicas)
                                                          : cost.allreduce_ms(grad_bytes, replicas));
    if (ms < best_ms * (1 - 1e-9)) {
      best_ms = ms;
      best = n;
    }
  }
  return best;
}

}  // namespace spindle::plan
