#include "libplan/plan/planner.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>

#include "libplan/alloc/alloc.h"
#include "libplan/graph/contract.h"
#include "libplan/place/place.h"
#include "libplan/plan/baselines.h"
#include "libplan/plan/cost_plan.h"
#include "libplan/util/limits.h"
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

// Scheduler variants tried by the Spindle strategy (waves/schedule.h):
// lengths tried per wave by the rollout variants, and slack thresholds.
constexpr int kLookahead = 8;
// Spindle schedules placed and costed: at most kScheduleCandidates of the
// paper's rounding and the per-level combination, each with compute time
// within kCandidateSlack of the shortest schedule of the paper's rounding.
constexpr int kScheduleCandidates = 4;
constexpr double kCandidateSlack = 0.01;
// Island placement passes (place_islands with the previous pass as hint).
constexpr int kPlacementPasses = 3;
constexpr double kDeferFractions[] = {0.0, 0.2, 0.3};
// Waves before a level whose idle devices the extended combination tries to
// give to the level's first operators (the last 1..kFillWaves).
constexpr int kFillWaves = 4;
// Level-by-level variants tried for the extended combination only (rollout
// lookahead, widening by size): the defer fraction and the rounding.
struct ExtraVariant {
  double defer_fraction;
  bool level_rounded;
};
constexpr ExtraVariant kExtraVariants[] = {{0.7, false}, {0.3, true}};

// What the strategies share: the contraction, each MetaOp's curve and valid
// device counts, and the relaxed optimum per level.
struct Prepared {
  Contraction contraction;
  std::vector<const ScalingCurve*> curves;   // by MetaOp id, never null
  std::vector<std::vector<int>> valid;       // by MetaOp id, never empty
  std::vector<std::vector<int>> by_level;    // MetaOp ids of each level, ascending
  std::vector<RelaxedAllocation> relaxed;    // by level
  double relaxed_optimum_ms = 0;             // sum over levels of C*
};

Result<Prepared> prepare(const PlanRequest& req) {
  Prepared p;
  const Model& model = *req.model;
  const int n_dev = req.cluster->devices();
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
  for (const std::vector<int>& ids : p.by_level) {
    std::vector<AllocItem> items;
    for (int id : ids)
      items.push_back({p.contraction.metaops[static_cast<size_t>(id)].length(),
                       p.curves[static_cast<size_t>(id)], p.valid[static_cast<size_t>(id)].back()});
    p.relaxed.push_back(relax_level(items, n_dev));
    p.relaxed_optimum_ms += p.relaxed.back().c_star_ms;
  }
  return p;
}

// What placement needs of the MetaOps: inputs, sizes, parameters.
PlaceInput placement_input(const Prepared& p, const PlanRequest& req) {
  const OpGraph& graph = *req.graph;
  const Cluster& cluster = *req.cluster;
  PlaceInput in;
  in.dtype_bytes = dtype_bytes(req.model->dtype);
  in.devices = cluster.devices();
  in.devices_per_island = cluster.devices_per_island;
  in.memory_bytes = static_cast<double>(cluster.memory_bytes());
  in.cost = req.cost;
  std::map<std::string, int> param_index;
  for (const MetaOp& m : p.contraction.metaops) {
    PlaceMetaOp pm;
    pm.inputs = m.inputs;
    pm.tensor_parallel = m.tensor_parallel;
    pm.batch = m.workload.batch;
    const Operator& first = graph.ops[static_cast<size_t>(m.operators.front())];
    pm.out_bytes_per_sample = output_bytes_per_sample(first, in.dtype_bytes);
    // Every operator of a MetaOp has its workload and tensor_parallel
    // (contraction): the cost model is asked once per MetaOp.
    const double bytes = static_cast<double>(req.cost->param_bytes(m.workload)) / m.tensor_parallel;
    const auto act_bytes = static_cast<double>(req.cost->activation_bytes_per_sample(m.workload));
    for (int o : m.operators) {
      const Operator& op = graph.ops[static_cast<size_t>(o)];
      int index = -1;
      if (bytes > 0) {
        auto [it, added] = param_index.emplace(op.param, static_cast<int>(in.param_bytes.size()));
        if (added) in.param_bytes.push_back(bytes);
        index = it->second;
      }
      pm.param.push_back(index);
      pm.act_bytes_per_sample.push_back(act_bytes);
    }
    in.metaops.push_back(std::move(pm));
  }
  return in;
}

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

// Same slots (MetaOp, operators, device count) in the same order.
bool same_wave(const AbstractWave& a, const AbstractWave& b) {
  if (a.slots.size() != b.slots.size()) return false;
  for (size_t i = 0; i < a.slots.size(); ++i) {
    const AbstractSlot& x = a.slots[i];
    const AbstractSlot& y = b.slots[i];
    if (x.metaop != y.metaop || x.first != y.first || x.count != y.count || x.devices != y.devices) return false;
  }
  return true;
}

// Spindle: per level, bi-point discretisation of the relaxed optimum, then
// wavefront scheduling (design.md, steps 5-7). Returns a few distinct
// schedules (placement and costing pick among them): the shortest few of
// the paper's rounding by compute time, then the per-level combination of
// every level-by-level schedule of both roundings.
std::vector<std::vector<AbstractWave>> spindle_waves(const Prepared& p, int n_dev, int island,
                                                     bool start_early) {
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

  // A small deterministic portfolio: our rules (greedy, and with a rollout
  // lookahead deferring MetaOps with slack or not; widening by remaining work
  // or by size) and the paper's Algorithm 1 as written, level by level and,
  // with start_early, also as one pool. Variants that never won on the
  // shipped workloads (greedy with deferral; one pool widening by size) are
  // left out to save time.
  std::vector<ScheduleOptions> variants;
  for (bool cross : {false, true}) {
    if (cross && !start_early) break;
    for (bool by_work : {true, false}) {
      if (cross && !by_work) continue;
      for (double defer : kDeferFractions) {
        for (int look : {0, kLookahead}) {
          if (look == 0 && defer > 0) continue;
          ScheduleOptions o;
          o.cross_level = cross;
          o.widen_by_work = by_work;
          o.defer_fraction = defer;
          o.lookahead = look;
          variants.push_back(o);
        }
      }
    }
    variants.emplace_back();
    variants.back().cross_level = cross;
    variants.back().paper_rules = true;
  }
  struct Draft {
    double ms = 0;                   // compute time
    std::vector<AbstractWave> waves;
    bool level_rounded = false;      // scheduled from level_rounded
    bool by_level = false;           // levels one after another
    const std::vector<ScheduleItem>* with = nullptr;   // the rounding scheduled
    ScheduleOptions options;
  };
  std::vector<Draft> drafts;
  auto run = [&](const std::vector<ScheduleItem>& with, const ScheduleOptions& o) {
    Draft d{0, schedule_waves(with, n_dev, o), &with == &level_rounded, !o.cross_level, &with, o};
    bool wider = false;   // some slot wider than an island
    for (const AbstractWave& w : d.waves) {
      d.ms += w.ms;
      for (const AbstractSlot& s : w.slots) wider = wider || s.devices > island;
    }
    drafts.push_back(std::move(d));
    return wider;
  };
  // Every variant runs on the paper's rounding; our level-by-level rules
  // widening by work also run on the level rounding. On several islands,
  // each level-by-level lookahead variant whose schedule spreads a slot over
  // more than an island runs again with tails kept inside an island
  // (placement and costing decide whether that pays).
  for (const ScheduleOptions& o : variants) {
    for (const std::vector<ScheduleItem>* with : {&items, &level_rounded}) {
      if (with == &level_rounded && (with->empty() || o.cross_level || o.paper_rules || !o.widen_by_work))
        continue;
      const bool wider = run(*with, o);
      if (wider && !o.paper_rules && !o.cross_level && o.lookahead > 0 && island > 0 && island < n_dev) {
        ScheduleOptions capped = o;
        capped.extend_cap = island;
        run(*with, capped);
      }
    }
  }

  // Extra level-by-level variants, for the extended combination only (they
  // join neither the candidates of the paper's rounding nor the
  // combination, so those stay what they were): widening by size, MetaOps
  // with under 70% of the largest remaining work deferred on the paper's
  // rounding, under 30% on the level rounding. A deferred MetaOp leaves its
  // devices to widen the critical ones and later takes what they leave
  // (ofasys-7 on 8 devices: level 3 in 112.9 ms instead of 122.0).
  const size_t first_extra = drafts.size();
  for (const ExtraVariant& e : kExtraVariants) {
    const std::vector<ScheduleItem>& with = e.level_rounded ? level_rounded : items;
    if (with.empty()) continue;
    ScheduleOptions o;
    o.lookahead = kLookahead;
    o.defer_fraction = e.defer_fraction;
    o.widen_by_work = false;
    run(with, o);
  }

  // Levels are independent in a level-by-level schedule (a level's waves
  // depend only on its own MetaOps): the combination takes each level's
  // waves from the level-by-level draft that runs it fastest (ties: the
  // earlier draft), so its compute time is at most every such draft's. The
  // extended combination does the same over the extra variants too.
  const size_t levels = p.by_level.size();
  auto level_of = [&](const AbstractWave& w) {
    return static_cast<size_t>(items[static_cast<size_t>(w.slots.front().metaop)].level);
  };
  std::vector<double> best_ms(levels, std::numeric_limits<double>::infinity());
  std::vector<size_t> best_draft(levels, 0);
  std::vector<double> level_ms(levels);
  Draft combined;
  auto combine = [&](size_t end) {
    for (size_t d = 0; d < end; ++d) {
      if (!drafts[d].by_level) continue;
      std::fill(level_ms.begin(), level_ms.end(), 0.0);
      for (const AbstractWave& w : drafts[d].waves) level_ms[level_of(w)] += w.ms;
      for (size_t l = 0; l < levels; ++l)
        if (level_ms[l] < best_ms[l] * (1 - 1e-12)) {
          best_ms[l] = level_ms[l];
          best_draft[l] = d;
        }
    }
  };
  combine(first_extra);
  for (size_t l = 0; l < levels; ++l)
    for (const AbstractWave& w : drafts[best_draft[l]].waves)
      if (level_of(w) == l) {
        combined.ms += w.ms;
        combined.waves.push_back(w);
      }
  combine(drafts.size());   // best_* now over every draft

  // Beyond the paper: the extended combination, where each level may also
  // start in the idle devices (in no slot) of the last waves before it
  // (fill_idle), when rescheduling the level after that (with its draft's
  // options and rounding) finishes it sooner. The filled waves keep their
  // length, so its compute time is at most the combination's.
  Draft extended;
  for (size_t l = 0; l < levels; ++l) {
    const Draft& src = drafts[best_draft[l]];
    std::vector<AbstractWave> best_before, best_level;
    double best_level_ms = best_ms[l];
    for (int k = 1; l > 0 && k <= kFillWaves && static_cast<size_t>(k) <= extended.waves.size(); ++k) {
      std::vector<AbstractWave> before = extended.waves;
      if (fill_idle(*src.with, n_dev, before, before.size() - static_cast<size_t>(k), static_cast<int>(l)) == 0)
        continue;
      std::vector<AbstractWave> rest = schedule_level(*src.with, n_dev, src.options, before, static_cast<int>(l));
      double ms = 0;
      for (const AbstractWave& w : rest) ms += w.ms;
      if (ms < best_level_ms * (1 - 1e-9)) {
        best_level_ms = ms;
        best_before = std::move(before);
        best_level = std::move(rest);
      }
    }
    if (!best_before.empty()) {
      extended.waves = std::move(best_before);
      for (AbstractWave& w : best_level) extended.waves.push_back(std::move(w));
    } else {
      for (const AbstractWave& w : src.waves)
        if (level_of(w) == l) extended.waves.push_back(w);
    }
  }
  for (const AbstractWave& w : extended.waves) extended.ms += w.ms;

  // Candidates: the shortest kScheduleCandidates distinct drafts of the
  // paper's rounding within kCandidateSlack of the shortest of them (stable:
  // ties keep the variant order), as before the combination existed, so no
  // plan gets worse; then the combination and the extended combination, each
  // when distinct and within the same window. They do not take another's
  // place: compute time is a poor guide to transfers and gradient sync, and
  // a schedule a little longer may place much better.
  std::vector<Draft*> nearest;
  for (size_t d = 0; d < first_extra; ++d)
    if (!drafts[d].level_rounded) nearest.push_back(&drafts[d]);
  std::stable_sort(nearest.begin(), nearest.end(), [](const Draft* a, const Draft* b) { return a->ms < b->ms; });
  const double window_ms = nearest.front()->ms * (1 + kCandidateSlack);
  std::vector<std::vector<AbstractWave>> out;
  auto add = [&](Draft& d) {
    if (d.ms > window_ms) return;
    for (const auto& o : out)
      if (o.size() == d.waves.size() && std::equal(o.begin(), o.end(), d.waves.begin(), same_wave)) return;
    out.push_back(std::move(d.waves));
  };
  for (Draft* d : nearest) {
    if (static_cast<int>(out.size()) == kScheduleCandidates) break;
    add(*d);
  }
  const double combined_ms = combined.ms;
  add(combined);
  if (extended.ms < combined_ms * (1 - 1e-9)) add(extended);
  return out;
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

Result<Plan> make_plan(const PlanRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  if (!request.model || !request.graph || !request.cluster || !request.cost)
    return Error{"make_plan: model, graph, cluster and cost model are all required"};
  const Model& model = *request.model;
  const Cluster& cluster = *request.cluster;
  if (cluster.devices() < 1)
    return Error{"cluster '" + cluster.name + "' has no devices"};

  Result<Prepared> prepared = prepare(request);
  if (!prepared.ok()) return prepared.error();
  const Prepared& p = *prepared;

  Plan plan;
  plan.strategy = strategy_name(request.strategy);
  plan.model_name = model.name;
  plan.model_sha256 = model.sha256;
  plan.cluster_name = cluster.name;
  plan.devices = cluster.devices();
  plan.devices_per_island = cluster.devices_per_island;
  plan.memory_bytes = cluster.memory_bytes();
  plan.profile_sha256 = request.profile_sha256;
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

  const BaselineInput baseline{&p.contraction, &p.curves, &p.valid,
                               static_cast<int>(model.tasks.size()), cluster.devices()};
  std::vector<std::vector<AbstractWave>> candidates;
  switch (request.strategy) {
    case Strategy::spindle:
      candidates = spindle_waves(p, cluster.devices(), cluster.devices_per_island, request.start_early);
      break;
    case Strategy::sequential: candidates = {sequential_waves(p, baseline)}; break;
    case Strategy::task_level: candidates = {task_level_waves(baseline)}; break;
    case Strategy::intra_task: candidates = {intra_task_waves(baseline)}; break;
  }
  // Placement, then costing. Island placement refines itself: each pass
  // knows where the previous one sent every slot's output. Over the
  // candidate schedules and passes, the plan with the shortest predicted
  // iteration wins (ties: the earlier one). `plan` is the scratch plan:
  // what costing writes (waves, param_groups, predicted) of a better one is
  // swapped into best_*, and the costing tables are built once.
  const CostTables tables = cost_tables(plan, model, *request.graph, *request.cost);
  bool have_best = false;
  std::vector<Wave> best_waves;
  std::vector<ParamGroup> best_groups;
  Predicted best_predicted;
  auto consider = [&](const std::vector<AbstractWave>& waves, const std::vector<WavePlacement>& placed) {
    emit_waves(waves, placed, plan);
    cost_plan(plan, tables, *request.cost);
    if (!have_best || plan.predicted.iteration_ms < best_predicted.iteration_ms * (1 - 1e-12)) {
      have_best = true;
      best_waves.swap(plan.waves);
      best_groups.swap(plan.param_groups);
      best_predicted = plan.predicted;
    }
  };
  const PlaceInput in = placement_input(p, request);
  for (const std::vector<AbstractWave>& waves : candidates) {
    if (request.placement == Placement::sequential) {
      consider(waves, place_sequential(waves, cluster.devices()));
      continue;
    }
    std::vector<WavePlacement> placed = place_islands(waves, in);
    consider(waves, placed);
    for (int pass = 1; pass < kPlacementPasses; ++pass) {
      placed = place_islands(waves, in, &placed);
      consider(waves, placed);
    }
  }
  plan.waves = std::move(best_waves);
  plan.param_groups = std::move(best_groups);
  plan.predicted = std::move(best_predicted);
  plan.predicted.relaxed_optimum_ms = p.relaxed_optimum_ms;
  plan.planning_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

}  // namespace spindle::plan
