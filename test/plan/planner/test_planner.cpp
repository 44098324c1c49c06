// make_plan end to end: Spindle and sequential plans on hand-set curves, and
// a planning-time/gap measurement on a 10-task CLIP-like model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "helpers.h"
#include "libplan/cost/analytic.h"
#include "libplan/lower/lower.h"
#include "libplan/plan/check.h"
#include "libplan/plan/plan_io.h"
#include "libplan/planner/cost_plan.h"
#include "libplan/planner/feasibility.h"
#include "libplan/planner/planner.h"
#include "libplan/sim/sim.h"
#include "test/plan/shipped_fixture.h"

using namespace spindle::plan;
using namespace spindle::plan::test;

namespace {

const char* kTwoTasks = R"(
name: two-tasks
modules:
  vision:
    - {op: patch_embed, in_dim: 48, hidden: 64}
    - {op: transformer_layer, repeat: 6, hidden: 64, heads: 4, ffn: 128}
    - {op: pool_project, in: 64, out: 32}
  text:
    - {op: token_embed, vocab: 100, hidden: 64}
    - {op: transformer_layer, repeat: 4, hidden: 64, heads: 4, ffn: 128, causal: true}
    - {op: pool_project, in: 64, out: 32}
  audio:
    blocks:
      - {op: patch_embed, in_dim: 48, hidden: 64}
      - {op: transformer_layer, repeat: 3, hidden: 64, heads: 4, ffn: 128}
      - {op: pool_project, in: 64, out: 32}
    tensor_parallel: 2
  loss:
    - {op: contrastive_loss, dim: 32}
tasks:
  - name: image-text
    batch: 16
    nodes:
      - {id: img, module: vision, seq: 16}
      - {id: txt, module: text, seq: 8}
      - {id: l, module: loss, inputs: [img, txt]}
  - name: audio-text
    batch: 12
    nodes:
      - {id: aud, module: audio, seq: 16}
      - {id: txt, module: text, seq: 8}
      - {id: l, module: loss, inputs: [aud, txt]}
)";

// Every workload of the graph gets T(n) = alpha + beta / n from its op kind.
TableCostModel table_cost(const OpGraph& g, const Cluster& cluster) {
  TableCostModel cost(cluster);
  std::map<std::string, bool> seen;
  for (const Operator& op : g.ops) {
    if (seen[op.workload.key()]) continue;
    seen[op.workload.key()] = true;
    double beta = 1;
    if (op.workload.op == "transformer_layer") beta = 2.0 * static_cast<double>(op.workload.seq);
    if (op.workload.op == "pool_project") beta = 0.5;
    std::vector<int> counts;
    for (int n = op.tensor_parallel; n <= cluster.devices(); n *= 2) counts.push_back(n);
    cost.set(op.workload, alpha_beta_curve(0.05, beta, counts), 1000, 100);
  }
  return cost;
}

struct Fixture {
  Model model;
  OpGraph graph;
  Cluster cluster;
};

Fixture two_tasks(int islands, int per_island) {
  Result<Model> m = parse_model_string(kTwoTasks, "two-tasks.yaml");
  REQUIRE(m.ok());
  Fixture f{*m, expand(*m), test_cluster(islands, per_island)};
  return f;
}


// Spindle's request on fixture `f` with `shifts` boundary shifts, every
// other setting the default (the optimizer state auto).
PlanRequest spindle_request(const spindle::plan::testing::Fixture& f, int shifts = 8) {
  PlanRequest r{&f.model, &f.graph, &f.cluster, f.cost.get(), "", Strategy::spindle};
  r.shift_simulations = shifts;
  return r;
}
}  // namespace

TEST_CASE("strategy names round-trip", "[planner]") {
  for (Strategy s : {Strategy::spindle, Strategy::sequential, Strategy::task_level,
                     Strategy::intra_task}) {
    Result<Strategy> back = parse_strategy(strategy_name(s));
    REQUIRE(back.ok());
    CHECK(*back == s);
  }
  CHECK_FALSE(parse_strategy("megatron").ok());
}

TEST_CASE("make_plan spindle: valid, deterministic, close to the relaxed optimum", "[planner]") {
  Fixture f = two_tasks(2, 4);
  TableCostModel cost = table_cost(f.graph, f.cluster);
  PlanRequest req{&f.model, &f.graph, &f.cluster, &cost, "abc", Strategy::spindle};
  Result<Plan> plan = make_plan(req);
  REQUIRE(plan.ok());
  CHECK(plan->strategy == "spindle");
  CHECK(plan->model_name == "two-tasks");
  CHECK(plan->devices == 8);
  CHECK(plan->devices_per_island == 4);
  CHECK(plan->profile_sha256 == "abc");
  CHECK(plan->planning_ms >= 0);
  const std::vector<std::string> violations = check_plan(*plan, f.model, f.graph);
  CHECK(violations == std::vector<std::string>{});   // prints them when not
  // 2 tasks x (embed, layers, pool) x 2 + 2 losses.
  REQUIRE(plan->metaops.size() == 14);
  CHECK(plan->metaops[0].task == "image-text");
  CHECK(plan->metaops[1].operators.size() == 6);
  CHECK(plan->metaops[1].inputs == std::vector<int>{0});
  for (const PlanMetaOp& m : plan->metaops)
    if (m.task == "audio-text" && m.workload.seq == 16) CHECK(m.tensor_parallel == 2);
  // Slices take count * T(n) ms; the audio slices (tensor_parallel 2, batch
  // 12) use 2, 4 or 6 devices.
  for (const Wave& w : plan->waves)
    for (const Slice& s : w.slices) {
      CHECK(s.ms > 0);
      if (plan->metaops[static_cast<size_t>(s.metaop)].tensor_parallel == 2)
        CHECK((s.devices.size() == 2 || s.devices.size() == 4 || s.devices.size() == 6));
    }
  const double relaxed = plan->predicted.relaxed_optimum_ms;
  CHECK(relaxed > 0);
  CHECK(plan->predicted.compute_ms >= relaxed * (1 - 1e-9));
  CHECK(plan->predicted.compute_ms <= relaxed * 1.5);
  // Same inputs, same bytes.
  Result<Plan> again = make_plan(req);
  REQUIRE(again.ok());
  CHECK(plan_to_json(*plan) == plan_to_json(*again));
}

TEST_CASE("make_plan sequential: one MetaOp per wave on the largest valid count", "[planner]") {
  Fixture f = two_tasks(2, 4);
  TableCostModel cost = table_cost(f.graph, f.cluster);
  PlanRequest req{&f.model, &f.graph, &f.cluster, &cost, "", Strategy::sequential};
  Result<Plan> plan = make_plan(req);
  REQUIRE(plan.ok());
  CHECK(plan->strategy == "sequential");
  const std::vector<std::string> violations = check_plan(*plan, f.model, f.graph);
  CHECK(violations == std::vector<std::string>{});   // prints them when not
  REQUIRE(plan->waves.size() == plan->metaops.size());
  std::string last_task;
  int task_switches = 0;
  for (size_t w = 0; w < plan->waves.size(); ++w) {
    REQUIRE(plan->waves[w].slices.size() == 1);
    const Slice& s = plan->waves[w].slices[0];
    const PlanMetaOp& m = plan->metaops[static_cast<size_t>(s.metaop)];
    CHECK(s.metaop == static_cast<int>(w));
    CHECK(s.first == 0);
    CHECK(s.count == static_cast<int>(m.operators.size()));
    // image-text: batch 16 -> 8 devices; audio-text: batch 12 -> 6, except
    // the audio module's tensor_parallel 2 MetaOps: 8 (4 groups of 3 rows,
    // rule 4).
    const int expected = m.task == "image-text" || m.tensor_parallel == 2 ? 8 : 6;
    CHECK(static_cast<int>(s.devices.size()) == expected);
    if (m.task != last_task) ++task_switches;
    last_task = m.task;
  }
  CHECK(task_switches == 2);   // task after task
  // Spindle is not slower than sequential on the same curves.
  PlanRequest sreq = req;
  sreq.strategy = Strategy::spindle;
  Result<Plan> sp = make_plan(sreq);
  REQUIRE(sp.ok());
  CHECK(sp->predicted.compute_ms < plan->predicted.compute_ms);
}

namespace {

// Three tasks whose losses are single operators: embeddings (level 0) and
// one lm_loss each (level 1), batch 4 on 4 devices (valid 1, 2, 4).
const char* kThreeLosses = R"(
name: three-losses
modules:
  a:
    - {op: patch_embed, in_dim: 4, hidden: 8}
    - {op: lm_loss, hidden: 8, vocab: 10}
  b:
    - {op: patch_embed, in_dim: 5, hidden: 8}
    - {op: lm_loss, hidden: 8, vocab: 11}
  c:
    - {op: patch_embed, in_dim: 6, hidden: 8}
    - {op: lm_loss, hidden: 8, vocab: 12}
tasks:
  - {name: ta, batch: 4, nodes: [{id: x, module: a, seq: 4}]}
  - {name: tb, batch: 4, nodes: [{id: x, module: b, seq: 4}]}
  - {name: tc, batch: 4, nodes: [{id: x, module: c, seq: 4}]}
)";

}  // namespace

TEST_CASE("make_plan spindle: single-operator losses reach the level's optimum", "[planner]") {
  // Level 1 is the level of test_alloc's "single operators take the larger
  // count": lm_loss with T = a/n, a = 6, 6, 8 (C* = 5). The paper's rounding
  // leaves the a = 6 losses on 1 device each, and the portfolio's first
  // variants all run the level in 6 ms on it; the level rounding puts each on
  // 2 devices and the level takes 4 + 1.5 = 5.5 ms (the combination).
  // Embeddings cost 0.001/n ms; no parameters, so no gradient sync.
  Result<Model> m = parse_model_string(kThreeLosses, "three-losses.yaml");
  REQUIRE(m.ok());
  const OpGraph graph = expand(*m);
  const Cluster cluster = test_cluster(1, 4);
  TableCostModel cost(cluster);
  const std::vector<int> counts{1, 2, 4};
  for (const Operator& op : graph.ops) {
    double a = 0.001;
    if (op.workload.op == "lm_loss") a = op.workload.dims["vocab"].get<int>() == 12 ? 8 : 6;
    cost.set(op.workload, alpha_beta_curve(0, a, counts), 0, 0);
  }
  PlanRequest req{&*m, &graph, &cluster, &cost, "", Strategy::spindle};
  // One optimizer state for both searches (auto may search a second time,
  // sharded, and keep whichever is faster: not the schedules compared here).
  req.choose_optimizer_state = false;
  req.optimizer_state = OptimizerState::replicated;
  // With the baselines' schedules among the candidates, the sequential one
  // wins here: every loss on all 4 devices is as short (T = a/n scales
  // perfectly: 1.5 + 1.5 + 2 = 5 ms) and moves nothing between waves.
  Result<Plan> with_baselines = make_plan(req);
  REQUIRE(with_baselines.ok());
  // Spindle's own portfolio:
  req.baseline_candidates = false;
  Result<Plan> plan = make_plan(req);
  REQUIRE(plan.ok());
  // No slower than Spindle's own candidates but by what the runner-up
  // (docs/planner.md, "Runner-up") gains there: among its own candidates
  // the winner has a runner-up of another group within 2%, shifted to
  // 5.00675 ms; with the baselines the sequential schedule wins (5.01534)
  // and none of the others comes within 2% of it.
  CHECK(with_baselines->predicted.simulated_ms <= plan->predicted.simulated_ms * 1.002);
  CHECK(with_baselines->predicted.compute_ms == Approx(5.0).margin(0.001));   // + the embeddings
  CHECK(check_plan(*plan, *m, graph) == std::vector<std::string>{});
  // The extended combination does better still: its variant deferring
  // MetaOps with under 70% of the largest remaining work, on the paper's
  // rounding (a = 6 on 1 device, 6 ms each; a = 8 on 2, 4 ms), holds the
  // a = 8 loss back, the idle devices widen the a = 6 losses to 2 each
  // (3 ms), and then the a = 8 loss takes all 4 (2 ms): 5 ms, C* itself.
  std::vector<std::pair<double, std::vector<size_t>>> loss_waves;   // ms, devices per slice
  double loss_ms = 0;
  for (const Wave& w : plan->waves) {
    if (plan->metaops[static_cast<size_t>(w.slices.front().metaop)].workload.op != "lm_loss") continue;
    loss_ms += w.ms;
    loss_waves.push_back({w.ms, {}});
    for (const Slice& s : w.slices) loss_waves.back().second.push_back(s.devices.size());
  }
  CHECK(loss_ms == Approx(5.0));
  REQUIRE(loss_waves.size() == 2);
  CHECK(loss_waves[0].first == Approx(3.0));
  CHECK(loss_waves[0].second == std::vector<size_t>{2, 2});
  CHECK(loss_waves[1].first == Approx(2.0));
  CHECK(loss_waves[1].second == std::vector<size_t>{4});
  CHECK(plan->predicted.compute_ms < 5.1);
  // At the optimum: C* is bisected to a relative width of 1e-9.
  CHECK(plan->predicted.compute_ms >= plan->predicted.relaxed_optimum_ms * (1 - 1e-9));
}

TEST_CASE("make_plan errors: missing curve", "[planner]") {
  Fixture f = two_tasks(1, 4);
  TableCostModel empty(f.cluster);
  PlanRequest req{&f.model, &f.graph, &f.cluster, &empty, "", Strategy::spindle};
  Result<Plan> plan = make_plan(req);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.error().message.find("no scaling curve for workload patch_embed") != std::string::npos);
  CHECK(plan.error().message.find("image-text") != std::string::npos);
}

TEST_CASE("communication-aware cap: the count minimising compute plus gradient all-reduce, by hand", "[planner]") {
  // 2 islands of 8; inside 1 GB/s, across 0.5 GB/s, no latency. T(n) = 10/n ms.
  Cluster c = test_cluster(2, 8);
  c.intra_island = {1, 0};
  c.inter_island = {0.5, 0};
  const TableCostModel cost(c);
  const std::vector<int> counts{1, 2, 4, 8, 16};
  const ScalingCurve curve = alpha_beta_curve(0, 10, counts);
  // 1e6 gradient bytes, one operator: n = 1: 10 ms; 2: 5 + 2 * 1/2 * 1 ms =
  // 6; 4: 2.5 + 1.5 = 4; 8: 1.25 + 1.75 = 3; 16 (across islands, 0.5
  // GB/s): 0.625 + 2 * 15/16 * 2 = 4.375. Eight devices are worth it.
  CHECK(comm_aware_cap(1, curve, counts, 1, 1e6, cost) == 8);
  // Four operators: 8: 5 + 1.75 = 6.75; 16: 2.5 + 3.75 = 6.25.
  CHECK(comm_aware_cap(4, curve, counts, 1, 1e6, cost) == 16);
  // Tensor parallel 2: the gradients are summed over n/2 replicas, devices
  // 0, 2, 4, ...: 4 -> {0, 2}: 2.5 + 1 = 3.5; 8 -> 4 replicas on one
  // island: 1.25 + 1.5 = 2.75; 16 -> 8 replicas across: 0.625 + 3.5 = 4.125.
  CHECK(comm_aware_cap(1, curve, {2, 4, 8, 16}, 2, 1e6, cost) == 8);
  // Nothing to sum: as wide as allowed.
  CHECK(comm_aware_cap(1, curve, counts, 1, 0, cost) == 16);
  // The queued caps count the bytes twice: four operators, 2e6 bytes: 8:
  // 5 + 2 * 7/8 * 2 = 8.5; 16: 2.5 + 2 * 15/16 * 4 = 10. Eight again.
  CHECK(comm_aware_cap(4, curve, counts, 1, 2e6, cost) == 8);
}

// Spindle's plan on `f` as requested by default (first) and with `off`
// applied to the request (second); the first checked against every rule.
template <class Off>
std::pair<Plan, Plan> with_and_without(const spindle::plan::testing::Fixture& f, Off off) {
  PlanRequest with{&f.model, &f.graph, &f.cluster, f.cost.get(), "", Strategy::spindle};
  // The state fixed (every case here fits it replicated): auto, sharding a
  // plan that simulates faster so, would compare two choices at once.
  with.choose_optimizer_state = false;
  with.optimizer_state = OptimizerState::replicated;
  PlanRequest without = with;
  off(without);
  Result<Plan> a = make_plan(with);
  Result<Plan> b = make_plan(without);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(check_plan(*a, f.model, f.graph).empty());
  return {std::move(*a), std::move(*b)};
}

TEST_CASE("queued caps: one more candidate group, never a slower plan here, faster on multitask-clip-7 on 32", "[planner]") {
  // docs/planner.md, "Communication-aware caps": multitask-clip-7 on
  // a800-4x8 is the case where the allocation capped with its gradient
  // bytes counted twice wins (208.1 -> 191.4 ms with the default shifts).
  // (Under the sanitizers the 64-device case is left out, as elsewhere.)
  struct Case {
    const char* model;
    const char* cluster;
    bool faster;   // by more than 3% with the queued caps
  };
  int planned = 0;
  for (const auto& [model, cluster, faster] :
       {Case{"multitask-clip-7", "a800-4x8", true}, Case{"multitask-clip-10", "a800-8x8", false}}) {
    if (spindle::plan::testing::left_out_when_sanitized(cluster)) continue;
    CAPTURE(model, cluster);
    ++planned;
    const spindle::plan::testing::Fixture f(model, cluster);
    const auto [a, b] = with_and_without(f, [](PlanRequest& r) { r.queued_sync_candidates = false; });
    CHECK(a.predicted.simulated_ms <= b.predicted.simulated_ms * (1 + 1e-12));
    // 190.968 against 199.220 ms (203.390 without the queued caps before
    // the runner-up of docs/planner.md, which reaches a faster plan there).
    if (faster) CHECK(a.predicted.simulated_ms < b.predicted.simulated_ms * 0.97);
  }
  CHECK(planned >= 1);
}

TEST_CASE("runner-up: the best schedule of another candidate group is finished too, the faster plan kept",
          "[planner][shipped]") {
  // docs/planner.md, "Runner-up". multitask-clip-4 on a800-8x8: the
  // uncapped schedule wins the candidate search by 0.6% and finishes at
  // 152.408 ms; the capped one, finished as well, at 141.451.
  // multitask-clip-10 on a800-1x8: 587.099 -> 586.579 ms. Each plan the
  // same on 1 and 2 threads (the refinement's bound is widened while the
  // runner-up is sought, so which one it is does not depend on them).
  struct Case {
    const char* model;
    const char* cluster;
    double ms;   // the plan with the runner-up
  };
  const char* before = std::getenv("SPINDLE_PLAN_THREADS");
  const std::string saved = before ? before : "";
  int planned = 0;
  for (const Case& c : {Case{"multitask-clip-10", "a800-1x8", 586.579}, Case{"multitask-clip-4", "a800-8x8", 141.451}}) {
    if (spindle::plan::testing::left_out_when_sanitized(c.cluster)) continue;
    CAPTURE(c.model, c.cluster);
    ++planned;
    const spindle::plan::testing::Fixture f(c.model, c.cluster);
    PlanRequest req{&f.model, &f.graph, &f.cluster, f.cost.get(), "", Strategy::spindle};
    std::vector<std::string> plans;
    for (const char* threads : {"1", "2"}) {
      setenv("SPINDLE_PLAN_THREADS", threads, 1);
      Result<Plan> plan = make_plan(req);
      REQUIRE(plan.ok());
      CHECK(plan->predicted.simulated_ms == Approx(c.ms).epsilon(1e-5));
      CHECK(check_plan(*plan, f.model, f.graph).empty());
      plan->planning_ms = 0;
      plans.push_back(plan_to_json(*plan));
    }
    CHECK(plans[0] == plans[1]);
  }
  if (before) setenv("SPINDLE_PLAN_THREADS", saved.c_str(), 1);
  else unsetenv("SPINDLE_PLAN_THREADS");
  CHECK(planned >= 1);
}

TEST_CASE("bucket cap: chosen after the shifts, never slower than the request's, lowered and simulated as the plan says",
          "[planner]") {
  // docs/planner.md, "Bucket cap". ofasys-7 on a800-4x8: 100 MiB buckets
  // merge shards the 25 MiB cap kept apart, so its all-reduces across
  // islands pay their latency fewer times (209.1 -> 197.0 ms). On one
  // island (latency 3 us) multitask-clip-10 keeps the request's 25 MiB.
  struct Case {
    const char* model;
    const char* cluster;
    double cap_mb;   // the cap the planner chooses
  };
  int planned = 0;
  for (const auto& [model, cluster, cap_mb] :
       {Case{"ofasys-7", "a800-4x8", 100}, Case{"multitask-clip-10", "a800-1x8", 25}}) {
    // Under the sanitizers, the one-island case only (7 s with both; the
    // cap step runs in every plan those tests make).
    if (spindle::plan::testing::sanitized_run() && cap_mb > 25) continue;
    ++planned;
    CAPTURE(model, cluster);
    const spindle::plan::testing::Fixture f(model, cluster);
    const auto [a, b] = with_and_without(f, [](PlanRequest& r) { r.choose_bucket_bytes = false; });
    CHECK(b.bucket_bytes == kDefaultBucketBytes);
    CHECK(a.bucket_bytes == bucket_bytes_of_mb(cap_mb));
    // The same waves (the cap is chosen after the shifts), never slower.
    REQUIRE(a.waves.size() == b.waves.size());
    auto cuts = [](const Plan& p) {
      std::vector<std::tuple<int, int, int, std::vector<int>>> all;
      for (const Wave& w : p.waves)
        for (const Slice& s : w.slices) all.emplace_back(s.metaop, s.first, s.count, s.devices);
      return all;
    };
    CHECK(cuts(a) == cuts(b));
    CHECK(a.predicted.simulated_ms <= b.predicted.simulated_ms * (1 + 1e-12));
    if (cap_mb > 25) CHECK(a.predicted.simulated_ms < b.predicted.simulated_ms * 0.95);
    // The plan's figure is the simulation of the programs lowered with its
    // own cap (SimOptions::sync empty), not with the default one.
    SimOptions own;
    own.timeline = false;
    const Result<Simulation> as_planned = simulate_plan(a, f.model, f.graph, *f.cost, own);
    REQUIRE(as_planned.ok());
    CHECK(as_planned->iteration_ms == a.predicted.simulated_ms);
    SimOptions at_default = own;
    at_default.sync = GradSync{};
    const Result<Simulation> at_25 = simulate_plan(a, f.model, f.graph, *f.cost, at_default);
    REQUIRE(at_25.ok());
    CHECK(at_25->iteration_ms == Approx(b.predicted.simulated_ms).epsilon(1e-12));
    // lower() follows the plan too: a bucket of two shards or more fits the cap.
    const Result<Lowered> lowered = lower(a, f.model, f.graph);
    REQUIRE(lowered.ok());
    int merged = 0;
    for (const Bucket& bucket : lowered->buckets)
      if (bucket.params.size() > 1) {
        CHECK(bucket.bytes <= a.bucket_bytes);
        if (bucket.bytes > kDefaultBucketBytes) ++merged;
      }
    CHECK((merged > 0) == (cap_mb > 25));
  }
  CHECK(planned >= 1);
}

TEST_CASE("width_optimum_ms: the relaxed optimum of the plan's own widths", "[planner]") {
  for (const auto& [model, cluster] : {std::pair{"qwen-val-3", "a800-8x8"}, std::pair{"multitask-clip-10", "a800-2x8"}}) {
    CAPTURE(model, cluster);
    const spindle::plan::testing::Fixture f(model, cluster);
    // The sequential plan runs every MetaOp on its largest valid count:
    // the same optimum as the planner's, computed from the plan alone.
    const Plan sequential = f.plan(Strategy::sequential);
    const Result<double> full = width_optimum_ms(sequential, *f.cost);
    REQUIRE(full.ok());
    CHECK(*full == Approx(sequential.predicted.relaxed_optimum_ms).epsilon(1e-9));
    // Spindle's plan never beats it, and a MetaOp capped narrower only
    // raises it.
    const Plan spindle = f.plan();
    const Result<double> own = width_optimum_ms(spindle, *f.cost);
    REQUIRE(own.ok());
    CHECK(*own >= spindle.predicted.relaxed_optimum_ms * (1 - 1e-9));
    Plan narrower = spindle;
    for (Wave& w : narrower.waves)
      for (Slice& s : w.slices)
        if (s.metaop == 0 && s.devices.size() > 1) s.devices.resize(s.devices.size() / 2);
    const Result<double> less = width_optimum_ms(narrower, *f.cost);
    REQUIRE(less.ok());
    CHECK(*less >= *own * (1 - 1e-9));
  }
  // qwen-val-3 on 64 devices: the communication-capped plan spreads its
  // trunk narrower than it could, so its own optimum is above the planner's.
  const spindle::plan::testing::Fixture q("qwen-val-3", "a800-8x8");
  const Plan capped = q.plan();
  CHECK(*width_optimum_ms(capped, *q.cost) > capped.predicted.relaxed_optimum_ms * 1.05);
  // A MetaOp with no slice is an error, not an optimum.
  Plan missing = capped;
  for (Wave& w : missing.waves)
    w.slices.erase(std::remove_if(w.slices.begin(), w.slices.end(), [](const Slice& s) { return s.metaop == 0; }),
                   w.slices.end());
  CHECK_FALSE(width_optimum_ms(missing, *q.cost).ok());
}

namespace {

// The reference for memory_as_run: `plan`'s memory per device costed again
// (cost_plan) with its optimizer state counted as `state`.
std::vector<int64_t> memory_with(const Plan& plan, OptimizerState state, const Model& model, const OpGraph& graph,
                                 const CostModel& cost) {
  Plan other = plan;
  other.optimizer_state = state;
  cost_plan(other, model, graph, cost);
  return std::move(other.predicted.memory_bytes);
}

// `base` with each operator's kept activations per sample given by
// `bytes` instead (cost_plan's memory then counts them so).
class ActivationsBy : public CostModel {
 public:
  ActivationsBy(const CostModel& base, std::function<int64_t(const Workload&)> bytes)
      : base_(base), bytes_(std::move(bytes)) {}
  const ScalingCurve* curve(const Workload& w) const override { return base_.curve(w); }
  int64_t param_bytes(const Workload& w) const override { return base_.param_bytes(w); }
  int64_t activation_bytes_per_sample(const Workload& w) const override { return bytes_(w); }
  double p2p_ms(double bytes, bool cross) const override { return base_.p2p_ms(bytes, cross); }
  double allreduce_ms(double bytes, const std::vector<int>& d) const override { return base_.allreduce_ms(bytes, d); }
  double allgather_ms(double bytes, const std::vector<int>& d) const override { return base_.allgather_ms(bytes, d); }

 private:
  const CostModel& base_;
  std::function<int64_t(const Workload&)> bytes_;
};

// Every operator's kept activations counted in fp32, as the analytic
// profile counts them, or none (the parameter state alone).
ActivationsBy fp32_activations(const CostModel& base) {
  return {base, [](const Workload& w) { return analytic_activation_bytes_per_sample(w, DType::fp32); }};
}
ActivationsBy no_activations(const CostModel& base) {
  return {base, [](const Workload&) { return int64_t{0}; }};
}

}  // namespace

TEST_CASE("optimizer state: replicated adds m, v and the master copy beyond each replica's share, and plans for it",
          "[planner]") {
  spindle::plan::testing::Fixture f("multitask-clip-7", "a800-1x8");
  PlanRequest request = spindle_request(f);
  request.choose_optimizer_state = false;
  auto sharded = make_plan(request);
  REQUIRE(sharded.ok());
  REQUIRE(sharded->optimizer_state == OptimizerState::sharded);
  const std::vector<int64_t>& mem = sharded->predicted.memory_bytes;
  CHECK(memory_with(*sharded, OptimizerState::sharded, f.model, f.graph, *f.cost) == mem);
  const std::vector<int64_t> as_run = memory_with(*sharded, OptimizerState::replicated, f.model, f.graph, *f.cost);
  // By hand from the plan's parameter groups: a bf16 shard of B bytes holds
  // B / 2 values; replicated, each of a group's r = devices / tp replicas
  // holds all 12 bytes of master copy, m and v per value, not 12 / r.
  REQUIRE(f.model.dtype == DType::bf16);
  const CostTables tables = cost_tables(*sharded, f.model, f.graph, *f.cost);
  std::map<std::string, const CostTables::Param*> by_name;
  for (const CostTables::Param& p : tables.params) by_name[p.name] = &p;
  std::vector<double> extra(static_cast<size_t>(sharded->devices), 0.0);
  int replicated_groups = 0;
  for (const ParamGroup& g : sharded->param_groups) {
    const CostTables::Param& p = *by_name.at(g.param);
    const double r = std::max(1.0, static_cast<double>(g.devices.size()) / p.tensor_parallel);
    replicated_groups += r > 1;
    for (int d : g.devices) extra[static_cast<size_t>(d)] += p.shard_bytes / 2 * 12 * (1 - 1 / r);
  }
  REQUIRE(replicated_groups > 0);
  bool grew = false;
  for (size_t d = 0; d < mem.size(); ++d) {
    CHECK(static_cast<double>(as_run[d] - mem[d]) == Approx(extra[d]).margin(2));   // each figure rounded to bytes
    grew = grew || as_run[d] > mem[d];
  }
  CHECK(grew);
  // spindle-run shards the state as the plan counts it (ZeRO-1), and keeps
  // the activations of this bf16 model in fp32 with what the plan's count
  // leaves to a fused attention: on the CPU backend at least the plan
  // costed with fp32 activations; on GPUs (a layer's internals in bf16)
  // less than on the CPU, still more than the plan counts.
  auto run = memory_as_run(*sharded, f.model, f.graph);
  auto gpu = memory_as_run(*sharded, f.model, f.graph, 2);
  REQUIRE(run.ok());
  REQUIRE(gpu.ok());
  const std::vector<int64_t> fp32_act =
      memory_with(*sharded, OptimizerState::sharded, f.model, f.graph, fp32_activations(*f.cost));
  bool wider = false;
  for (size_t d = 0; d < mem.size(); ++d) {
    CHECK((*run)[d] >= fp32_act[d]);
    CHECK((*gpu)[d] < (*run)[d]);
    CHECK((*gpu)[d] > mem[d]);
    wider = wider || (*run)[d] > mem[d] + (int64_t{1} << 30);   // GiBs more on some device
  }
  CHECK(wider);

  // Planned replicated: recorded, costed so, and it fits.
  request.optimizer_state = OptimizerState::replicated;
  auto replicated = make_plan(request);
  REQUIRE(replicated.ok());
  CHECK(replicated->optimizer_state == OptimizerState::replicated);
  CHECK(memory_with(*replicated, OptimizerState::replicated, f.model, f.graph, *f.cost) ==
        replicated->predicted.memory_bytes);
  CHECK(check_plan_memory(*replicated, f.model).ok());
  auto back = parse_plan_string(plan_to_json(*replicated), "p.json");
  REQUIRE(back.ok());
  CHECK(back->optimizer_state == OptimizerState::replicated);

  // On devices of 50 GiB the sharded plan fits (47.1 GiB at its peak; 51.3
  // GiB were the state replicated), and no replicated plan fits.
  Cluster small = f.cluster;
  small.memory_gib = 50;
  request.cluster = &small;
  request.optimizer_state = OptimizerState::sharded;
  auto fits_sharded = make_plan(request);
  REQUIRE(fits_sharded.ok());
  CHECK(check_plan_memory(*fits_sharded, f.model).ok());
  const std::vector<int64_t> over = memory_with(*fits_sharded, OptimizerState::replicated, f.model, f.graph, *f.cost);
  CHECK(*std::max_element(over.begin(), over.end()) > small.memory_bytes());
  request.optimizer_state = OptimizerState::replicated;
  auto none = make_plan(request);
  CHECK((!none.ok() || !check_plan_memory(*none, f.model).ok()));
  // spindle-run refuses it there: it keeps the activations in fp32.
  const Status fp32_refused = check_memory_as_run(*fits_sharded, f.model, f.graph, "p.json");
  REQUIRE_FALSE(fp32_refused.ok());
  CHECK_THAT(fp32_refused.error().message,
             Catch::Contains("p.json: device") && Catch::Contains("activations in bf16, which spindle-run keeps in fp32"));
  // On devices of exactly its peak it runs; one byte less, refused, naming
  // the device and, its state sharded, the all-gathers' buffers; smaller
  // buckets hold the same bytes: not advised.
  auto host = memory_as_run(*fits_sharded, f.model, f.graph);
  REQUIRE(host.ok());
  Plan tight = *fits_sharded;
  tight.memory_bytes = *std::max_element(host->begin(), host->end());
  CHECK(check_memory_as_run(tight, f.model, f.graph, "p.json").ok());
  tight.memory_bytes -= 1;
  const Status refused = check_memory_as_run(tight, f.model, f.graph, "p.json");
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.error().message, Catch::Contains("p.json: device") &&
                                          Catch::Contains("nor each gradient bucket's all-gather buffers") &&
                                          !Catch::Contains("--bucket-mb"));
}

TEST_CASE("optimizer state auto: replicated where that plan fits, sharded where that plans faster or it does not fit",
          "[planner]") {
  spindle::plan::testing::Fixture f("multitask-clip-7", "a800-1x8");
  PlanRequest request = spindle_request(f);
  REQUIRE(request.choose_optimizer_state);   // the default
  auto plan_as = [&](const Cluster& cluster, std::optional<OptimizerState> state,
                     std::optional<OptimizerState> placed = std::nullopt) {
    PlanRequest r = request;
    r.cluster = &cluster;
    r.choose_optimizer_state = !state;
    if (state) r.optimizer_state = *state;
    r.placement_state = placed;
    return make_plan(r);
  };
  // 80 GiB: replicated fits. Its plan (placed counting the state sharded,
  // as every plan was placed before) re-simulated sharded comes within 2%
  // of it (kShardedSearchWithin), so auto plans it sharded too. That plan
  // simulates faster, but only by its communication: its compute alone is
  // slower (a larger compute gap), so auto keeps the replicated plan.
  auto chosen = plan_as(f.cluster, std::nullopt);
  REQUIRE(chosen.ok());
  auto same = plan_as(f.cluster, OptimizerState::replicated, OptimizerState::sharded);
  REQUIRE(same.ok());
  auto searched = plan_as(f.cluster, OptimizerState::sharded);
  REQUIRE(searched.ok());
  Plan resharded = *same;
  resharded.optimizer_state = OptimizerState::sharded;
  double closest = std::numeric_limits<double>::infinity();
  for (ParamGather gather : {ParamGather::after_step, ParamGather::next_step}) {
    resharded.param_gather = gather;
    auto sim = simulate_plan(resharded, f.model, f.graph, *f.cost);
    REQUIRE(sim.ok());
    closest = std::min(closest, sim->iteration_ms);
  }
  CHECK(closest <= same->predicted.simulated_ms * 1.02);
  CHECK(closest > same->predicted.simulated_ms);   // not faster as it stands
  REQUIRE(searched->predicted.simulated_ms < same->predicted.simulated_ms);
  auto gap_of = [](const Plan& p, const spindle::plan::testing::Fixture& on) {
    auto gap = simulated_compute_gap(p, on.model, on.graph, *on.cost);
    REQUIRE(gap.ok());
    return *gap;
  };
  CHECK(gap_of(*searched, f) > gap_of(*same, f) + 1e-6);
  CHECK(chosen->optimizer_state == OptimizerState::replicated);
  CHECK(chosen->sharded_because == Plan::ShardedBecause::none);
  CHECK(plan_to_json(*chosen) == plan_to_json(*same));
  // multitask-clip-4 on the same cluster: re-simulated sharded, its
  // replicated plan is faster already (auto shards it), and the sharded
  // search is faster still, at the same compute: auto keeps that plan.
  spindle::plan::testing::Fixture four("multitask-clip-4", "a800-1x8");
  PlanRequest four_request = spindle_request(four);
  auto four_chosen = make_plan(four_request);
  REQUIRE(four_chosen.ok());
  PlanRequest first_request = four_request;
  spindle::plan::testing::as_first_attempt(first_request);
  auto four_first = make_plan(first_request);
  REQUIRE(four_first.ok());
  PlanRequest sharded_request = four_request;
  sharded_request.choose_optimizer_state = false;
  sharded_request.optimizer_state = OptimizerState::sharded;
  auto four_searched = make_plan(sharded_request);
  REQUIRE(four_searched.ok());
  CHECK(gap_of(*four_searched, four) <= gap_of(*four_first, four) + 1e-9);
  CHECK(four_chosen->optimizer_state == OptimizerState::sharded);
  CHECK(four_chosen->sharded_because == Plan::ShardedBecause::faster);
  CHECK(four_chosen->replicated_ms == four_first->predicted.simulated_ms);
  CHECK(check_plan_memory(*four_chosen, four.model).ok());
  CHECK(plan_to_json(*four_chosen) == plan_to_json(*four_searched));
  // With more MetaOps than sharded_search_metaops, auto does not search
  // again: it keeps the replicated plan re-simulated sharded, slower.
  PlanRequest capped = four_request;
  capped.sharded_search_metaops = static_cast<int>(four_first->metaops.size()) - 1;
  auto once = make_plan(capped);
  REQUIRE(once.ok());
  CHECK(once->optimizer_state == OptimizerState::sharded);
  CHECK(once->replicated_ms == four_first->predicted.simulated_ms);
  CHECK(once->predicted.simulated_ms < four_first->predicted.simulated_ms);
  CHECK(once->predicted.simulated_ms > four_chosen->predicted.simulated_ms);
  // Where the replicated plan re-simulated sharded is further off (21% on
  // 32 devices), auto keeps it replicated, as placed.
  spindle::plan::testing::Fixture wide("multitask-clip-7", "a800-4x8");
  PlanRequest wide_request = spindle_request(wide);
  auto kept = make_plan(wide_request);
  REQUIRE(kept.ok());
  CHECK(kept->optimizer_state == OptimizerState::replicated);
  CHECK(kept->sharded_because == Plan::ShardedBecause::none);
  spindle::plan::testing::as_first_attempt(wide_request);
  auto wide_same = make_plan(wide_request);
  REQUIRE(wide_same.ok());
  CHECK(plan_to_json(*kept) == plan_to_json(*wide_same));
  // 50 GiB: replicated fits no placement, so auto shards it.
  Cluster small = f.cluster;
  small.memory_gib = 50;
  auto whole = plan_as(small, OptimizerState::replicated);
  CHECK((!whole.ok() || !check_plan_memory(*whole, f.model).ok()));
  auto sharded = plan_as(small, std::nullopt);
  REQUIRE(sharded.ok());
  CHECK(sharded->optimizer_state == OptimizerState::sharded);
  CHECK(check_plan_memory(*sharded, f.model).ok());
  auto asked = plan_as(small, OptimizerState::sharded);
  REQUIRE(asked.ok());
  CHECK(plan_to_json(*sharded) == plan_to_json(*asked));
  // Its all-gathers blocking after the step are priced: slower than the
  // same plan's programs without them (the state counted replicated,
  // memory aside).
  Plan after_step = *sharded, unsharded = *sharded;
  after_step.param_gather = ParamGather::after_step;
  unsharded.optimizer_state = OptimizerState::replicated;
  auto with = simulate_plan(after_step, f.model, f.graph, *f.cost);
  auto without = simulate_plan(unsharded, f.model, f.graph, *f.cost);
  REQUIRE(with.ok());
  REQUIRE(without.ok());
  CHECK(with->iteration_ms > without->iteration_ms);
  // Where the plan gathers them (Plan::param_gather) is the faster way for
  // it: here at the next step's start, which hides them behind its
  // forwards (faster than the replicated programs' whole all-reduces even).
  Plan flipped = *sharded;
  flipped.param_gather =
      sharded->param_gather == ParamGather::next_step ? ParamGather::after_step : ParamGather::next_step;
  auto chosen_sim = simulate_plan(*sharded, f.model, f.graph, *f.cost);
  auto other_sim = simulate_plan(flipped, f.model, f.graph, *f.cost);
  REQUIRE(chosen_sim.ok());
  REQUIRE(other_sim.ok());
  CHECK(chosen_sim->iteration_ms == Approx(sharded->predicted.simulated_ms).epsilon(1e-9));
  CHECK(chosen_sim->iteration_ms < other_sim->iteration_ms);
  CHECK(sharded->param_gather == ParamGather::next_step);
  CHECK(chosen_sim->iteration_ms < without->iteration_ms);
}

TEST_CASE("optimizer state auto: sharded where the replicated plan fits its count and only sharded what spindle-run holds on GPUs",
          "[planner]") {
  // multitask-clip-10 on 8 A800s: replicated, the plan counts about 65
  // GiB a device, but spindle-run would hold about 85 on GPUs (the
  // attention probabilities, the fp32 parameter state) of 80 and refuse
  // it. Sharded it holds about 79 and fits; auto plans that. (qwen-val-3 on 64 was this case until
  // the gradients became views of their buckets on GPUs too.)
  spindle::plan::testing::Fixture f("multitask-clip-10", "a800-1x8");
  PlanRequest request = spindle_request(f);
  auto on_gpus = [&](const Plan& p) { return check_memory_as_run(p, f.model, f.graph, "p.json", kBf16LayerValueBytes); };
  PlanRequest replicated_request = request;
  replicated_request.choose_optimizer_state = false;
  replicated_request.optimizer_state = OptimizerState::replicated;
  replicated_request.placement_state = OptimizerState::sharded;   // as auto's first plan
  auto replicated = make_plan(replicated_request);
  REQUIRE(replicated.ok());
  REQUIRE(check_plan_memory(*replicated, f.model).ok());
  const Status refused = on_gpus(*replicated);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.error().message, Catch::Contains("p.json: device"));
  // The same waves sharded fit: that is the figure sharding_fits_on_gpus
  // gives (the peak of memory_as_run over NCCL with the state sharded).
  const std::optional<int64_t> with = sharding_fits_on_gpus(*replicated, f.model, f.graph);
  REQUIRE(with.has_value());
  Plan same_waves = *replicated;
  same_waves.optimizer_state = OptimizerState::sharded;
  auto same_mem = memory_as_run(same_waves, f.model, f.graph, kBf16LayerValueBytes);
  REQUIRE(same_mem.ok());
  CHECK(*with == *std::max_element(same_mem->begin(), same_mem->end()));
  CHECK(*with <= replicated->memory_bytes);
  auto chosen = make_plan(request);
  REQUIRE(chosen.ok());
  CHECK(chosen->optimizer_state == OptimizerState::sharded);
  CHECK(chosen->sharded_because == Plan::ShardedBecause::does_not_fit_as_run);
  CHECK(check_plan_memory(*chosen, f.model).ok());
  CHECK(on_gpus(*chosen).ok());
  PlanRequest sharded_request = request;
  sharded_request.choose_optimizer_state = false;
  sharded_request.optimizer_state = OptimizerState::sharded;
  auto asked = make_plan(sharded_request);
  REQUIRE(asked.ok());
  // Auto keeps the faster of the sharded search's plan (which fits here
  // too) and the same waves sharded: here the same waves (588.3 against
  // 593.1 ms; with the default 128 shifts both are the same plan).
  CHECK(on_gpus(*asked).ok());
  CHECK(chosen->predicted.simulated_ms < asked->predicted.simulated_ms);
  auto chosen_mem = memory_as_run(*chosen, f.model, f.graph, kBf16LayerValueBytes);
  REQUIRE(chosen_mem.ok());
  CHECK(*std::max_element(chosen_mem->begin(), chosen_mem->end()) == *with);   // the same waves
  CHECK_FALSE(sharding_fits_on_gpus(*chosen, f.model, f.graph).has_value());   // sharded already
  // A model of more MetaOps than sharded_search_metaops is not asked (as
  // it is not searched sharded again): the count's decision, here the
  // replicated plan.
  PlanRequest capped = request;
  capped.sharded_search_metaops = static_cast<int>(replicated->metaops.size()) - 1;
  auto not_asked = make_plan(capped);
  REQUIRE(not_asked.ok());
  CHECK(not_asked->optimizer_state == OptimizerState::replicated);
  CHECK(plan_to_json(*not_asked) == plan_to_json(*replicated));
  // (Where the replicated plan fits both, auto keeps it: multitask-clip-7
  // on a800-4x8, the test case before.)
  // multitask-clip-4 on 32 devices of 24 GiB: replicated 24.4 GiB on
  // GPUs, the same waves sharded 23.0, but the sharded search places them
  // again at 25.0 (a review found such a case, then ofasys-7 on 32 of 34
  // GiB, until lm_loss and the gradients held less): auto keeps those
  // same waves sharded, which fit. (cli:plan-run-mem-hint: the same
  // model's search over with the default shifts, on 23 GiB.)
  spindle::plan::testing::Fixture seven("multitask-clip-4", "a800-4x8");
  seven.cluster.memory_gib = 24;
  PlanRequest seven_request = spindle_request(seven);
  PlanRequest seven_sharded = seven_request;
  seven_sharded.choose_optimizer_state = false;
  seven_sharded.optimizer_state = OptimizerState::sharded;
  auto seven_searched = make_plan(seven_sharded);
  REQUIRE(seven_searched.ok());
  auto on_seven = [&](const Plan& p) {
    return check_memory_as_run(p, seven.model, seven.graph, "p.json", kBf16LayerValueBytes);
  };
  const Status searched_over = on_seven(*seven_searched);
  REQUIRE_FALSE(searched_over.ok());   // the case: the search's own plan is over
  // Its refusal says what the plan's count leaves out for a sharded bf16
  // plan: the parameters and gradients, which spindle-run keeps in fp32.
  CHECK_THAT(searched_over.error().message,
             Catch::Contains("the parameters and their gradients in bf16, which it keeps in fp32 on every replica") &&
                 Catch::EndsWith("plan again on more devices"));
  auto seven_chosen = make_plan(seven_request);
  REQUIRE(seven_chosen.ok());
  CHECK(seven_chosen->optimizer_state == OptimizerState::sharded);
  CHECK(seven_chosen->sharded_because == Plan::ShardedBecause::does_not_fit_as_run);
  CHECK(on_seven(*seven_chosen).ok());
  CHECK(check_plan_memory(*seven_chosen, seven.model).ok());
  CHECK(check_plan(*seven_chosen, seven.model, seven.graph).empty());
  // ofasys-7 on 8 A800s: its replicated plan is over on GPUs, and the same
  // waves sharded too (their activations, not the state): the decision is
  // the plan's own count, which it fits, so auto keeps it replicated
  // rather than search again for a plan that would not run either.
  spindle::plan::testing::Fixture ofa("ofasys-7", "a800-1x8");
  PlanRequest ofa_request = spindle_request(ofa);
  auto ofa_chosen = make_plan(ofa_request);
  REQUIRE(ofa_chosen.ok());
  REQUIRE(ofa_chosen->optimizer_state == OptimizerState::replicated);
  CHECK(check_plan_memory(*ofa_chosen, ofa.model).ok());
  CHECK_FALSE(check_memory_as_run(*ofa_chosen, ofa.model, ofa.graph, "p.json", kBf16LayerValueBytes).ok());
  CHECK_FALSE(sharding_fits_on_gpus(*ofa_chosen, ofa.model, ofa.graph).has_value());
}

TEST_CASE("analytic_run_activation: what the runtime keeps per row, by hand", "[planner]") {
  // tiny-clip's vision layer: s 17, hidden 32, ffn 64, 4 heads; s padded
  // to 24. fp32 whole on every rank: 2 s h + 4 s = 1156 values; in the
  // layer's width 3 s h = 1632 values; split: q, k, v at the padded
  // sequence 3 x 24 h, the heads' output s h, 2 s f, heads 24^2 = 2304 +
  // 544 + 2176 + 2304 = 7328 values.
  Workload layer{"transformer_layer", {{"hidden", 32}, {"ffn", 64}, {"heads", 4}}, 17, 24};
  RunActivation a = analytic_run_activation(layer);
  CHECK(a.replicated == 4 * 1156 + 4 * 1632);
  CHECK(a.split == 4 * 7328);
  a = analytic_run_activation(layer, 2);   // the CUDA backend's bf16 mode
  CHECK(a.replicated == 4 * 1156 + 2 * 1632);
  CHECK(a.split == 2 * 7328);
  // A linear of 8 rows 48 -> 16: its input and output, 8 (48 + 16) values.
  a = analytic_run_activation({"linear", {{"in", 48}, {"out", 16}}, 8, 12});
  CHECK(a.replicated == 4 * 8 * 64);
  CHECK(a.split == 0);
  // The contrastive loss of a batch of 24 in dimension 16, per row of the
  // whole batch: two normalised rows, two norms, a row and a column of
  // each softmax: 2 x 16 + 2 + 2 x 24 = 82 values.
  a = analytic_run_activation({"contrastive_loss", {{"dim", 16}}, 1, 24});
  CHECK(a.replicated == 4 * 82);
  // lm_loss over 8 tokens, hidden 32, vocabulary 64: 2 s h + 3 s = 536
  // whole, s vocab = 512 split over the vocabulary's ranks.
  a = analytic_run_activation({"lm_loss", {{"hidden", 32}, {"vocab", 64}}, 8, 4});
  CHECK(a.replicated == 4 * 536);
  CHECK(a.split == 4 * 512);
  // Its transients are of the hidden width only (dL/dlogits is made in
  // the probabilities' buffer); every other operator's are what it keeps.
  CHECK(a.transient_replicated == 4 * 536);
  CHECK(a.transient_split == 0);
  a = analytic_run_activation(layer);
  CHECK(a.transient_replicated == a.replicated);
  CHECK(a.transient_split == a.split);
  // pool_project of 17 tokens 32 -> 16 keeps 2 x 32 + 2 + 16 = 82 values
  // a row, and its backward makes dL/dx over the sequence, 17 x 32, and
  // three [32]: 544 + 96 + 16 = 656 values.
  a = analytic_run_activation({"pool_project", {{"in", 32}, {"out", 16}}, 17, 24});
  CHECK(a.replicated == 4 * 82);
  CHECK(a.transient_replicated == 4 * 656);
  CHECK(a.transient_split == 0);
}

TEST_CASE("memory_as_run on one device: the parameter state, every operator's activations, and the largest twice more",
          "[planner]") {
  // One device runs every operator of the model on the whole batch (no
  // tensor parallelism): the activations are the sum over the graph's
  // operators of batch x (replicated + split), plus twice the largest of them
  // (the backward pass's working set), on top of the parameter state.
  spindle::plan::testing::Fixture f("tiny-clip", "cpu-1x1");
  const Plan plan = f.plan(Strategy::sequential);
  REQUIRE(plan.devices == 1);
  double sum = 0, largest = 0;
  for (const Operator& op : f.graph.ops) {
    const RunActivation a = analytic_run_activation(op.workload);
    const double batch = static_cast<double>(op.workload.batch);
    sum += batch * (a.replicated + a.split);
    largest = std::max(largest, batch * (a.transient_replicated + a.transient_split));
  }
  REQUIRE(f.graph.ops.size() == 25);   // 9 + 8 + 8 operators of the three tasks
  const std::vector<int64_t> state =
      memory_with(plan, plan.optimizer_state, f.model, f.graph, no_activations(*f.cost));
  auto run = memory_as_run(plan, f.model, f.graph);
  REQUIRE(run.ok());
  // One device: no messages to other devices, no all-gather (replicated).
  REQUIRE(plan.optimizer_state == OptimizerState::replicated);
  CHECK(static_cast<double>((*run)[0]) == Approx(static_cast<double>(state[0]) + sum + 2 * largest).margin(1));
}

TEST_CASE("memory_as_run: the parameter state in fp32 whatever the model's dtype, 16 bytes a value replicated, 8 + 8/R sharded",
          "[planner]") {
  // spindle-run keeps values, gradients and AdamW's moments in fp32 on
  // every backend, and the CPU backend every activation too: the same plan
  // of a bf16 model holds what it holds for the fp32 model, byte for byte.
  // (Counted at the model's dtype, a bf16 model's sharded state came
  // 4 (1 - 1/R) bytes a value short.)
  spindle::plan::testing::Fixture f("tiny-clip", "cpu-1x2");
  Model bf16 = f.model;
  bf16.dtype = DType::bf16;
  for (Strategy s : {Strategy::sequential, Strategy::spindle}) {
    const Plan planned = f.plan(s);
    auto lowered = lower(planned, f.model, f.graph);
    REQUIRE(lowered.ok());
    std::vector<int64_t> by_state[2];
    for (OptimizerState state : {OptimizerState::replicated, OptimizerState::sharded}) {
      CAPTURE(strategy_name(s), optimizer_state_name(state));
      Plan plan = planned;
      plan.optimizer_state = state;
      auto fp32_run = memory_as_run(plan, f.model, f.graph);
      auto bf16_run = memory_as_run(plan, bf16, f.graph);
      REQUIRE(fp32_run.ok());
      REQUIRE(bf16_run.ok());
      CHECK(*bf16_run == *fp32_run);
      by_state[state == OptimizerState::sharded] = *bf16_run;
    }
    // Replicated less sharded, by hand from the lowering's buckets (every
    // parameter value is in one, on each of its R holders): the moments'
    // 8 bytes a value less 8 / R, less the all-gather's buffers sharded
    // state adds (R chunks gathered and the chunk sent, 4 bytes a value).
    std::vector<double> expected(static_cast<size_t>(planned.devices), 0.0);
    for (const Bucket& b : lowered->buckets) {
      const double r = static_cast<double>(b.devices.size());
      const double chunk = std::ceil(static_cast<double>(b.values) / r);
      for (int d : b.devices)
        expected[static_cast<size_t>(d)] += 8.0 * static_cast<double>(b.values) * (1 - 1 / r) - 4.0 * chunk * (r + 1);
    }
    for (size_t d = 0; d < expected.size(); ++d) {
      CAPTURE(strategy_name(s), d);
      CHECK(static_cast<double>(by_state[0][d] - by_state[1][d]) == Approx(expected[d]).margin(64));
    }
  }
}

TEST_CASE("memory_as_run: more than the plan counts, and every all-gather's buffers", "[planner]") {
  for (const char* name : {"tiny-lm", "tiny-clip"}) {
    spindle::plan::testing::Fixture f(name, "cpu-1x4");
    for (Strategy s : {Strategy::spindle, Strategy::sequential, Strategy::task_level, Strategy::intra_task})
      for (OptimizerState state : {OptimizerState::sharded, OptimizerState::replicated}) {
        CAPTURE(name, strategy_name(s), optimizer_state_name(state));
        Plan plan = f.plan(s);
        plan.optimizer_state = state;
        cost_plan(plan, f.model, f.graph, *f.cost);
        auto run = memory_as_run(plan, f.model, f.graph);
        REQUIRE(run.ok());
        for (size_t d = 0; d < run->size(); ++d)   // the plan's count leaves out the probabilities and outputs
          CHECK((*run)[d] > plan.predicted.memory_bytes[d]);
        // With sharded state every all-gather's buffers (members x chunk
        // values gathered, plus the chunk sent; all in flight at once with
        // overlap), by hand from the lowering's buckets, on every backend.
        // The gradients are views of the buckets' flat buffers (the host,
        // and NCCL): no copy of them.
        auto lowered = lower(plan, f.model, f.graph);
        REQUIRE(lowered.ok());
        const size_t n = plan.predicted.memory_bytes.size();
        std::vector<double> gather(n, 0.0);
        for (const Bucket& b : lowered->buckets) {
          const double p = static_cast<double>(b.devices.size());
          const double chunk = std::ceil(static_cast<double>(b.values) / p);
          for (int d : b.devices)
            if (state == OptimizerState::sharded) gather[static_cast<size_t>(d)] += 4.0 * chunk * (p + 1);
        }
        if (s == Strategy::sequential) CHECK(!lowered->buckets.empty());   // every MetaOp on all 4 devices
        // The all-gathers' buffers are in the host's figure: the same plan
        // replicated holds none, and the host figure of the sharded one
        // minus them is below the replicated one's (less optimizer state).
        if (state == OptimizerState::sharded) {
          Plan whole = plan;
          whole.optimizer_state = OptimizerState::replicated;
          cost_plan(whole, f.model, f.graph, *f.cost);
          auto whole_run = memory_as_run(whole, f.model, f.graph);
          REQUIRE(whole_run.ok());
          for (size_t d = 0; d < n; ++d)
            CHECK(static_cast<double>((*run)[d]) - gather[d] <= static_cast<double>((*whole_run)[d]) + 1);
        }
      }
  }
}

TEST_CASE("held_shards: the shards memory counts are those the lowering gives spindle-run to allocate",
          "[planner]") {
  // The executor allocates one (parameter, TP rank) shard per slice
  // position it runs and all-reduces it over Lowered::shard_devices (the
  // lowering's holders_by_rank, written separately): the two lists agree
  // device by device, on plans where a device holds a parameter at two
  // ranks (qwen-val-3 on 8 A800s: devices 2-6) and on the tiny models.
  int two_ranks = 0;
  for (const auto& [model_name, cluster_name] :
       {std::pair{"qwen-val-3", "a800-1x8"}, std::pair{"tiny-lm", "cpu-1x3"}, std::pair{"tiny-lm", "cpu-1x4"},
        std::pair{"tiny-clip", "cpu-1x4"}, std::pair{"multitask-clip-7", "a800-1x8"}}) {
    CAPTURE(model_name, cluster_name);
    spindle::plan::testing::Fixture f(model_name, cluster_name);
    const Plan plan = f.plan();
    const CostTables tables = cost_tables(plan, f.model, f.graph, *f.cost);
    const std::vector<HeldShard> held = held_shards(plan, [&](int m, int k) {
      return tables.metaops[static_cast<size_t>(m)].param[static_cast<size_t>(k)];
    });
    std::set<std::tuple<std::string, int, int>> counted, lowered;
    std::map<std::pair<std::string, int>, std::set<int>> ranks;   // (param, device) -> ranks
    for (const HeldShard& h : held) {
      const CostTables::Param& p = tables.params[static_cast<size_t>(h.param)];
      if (p.shard_bytes == 0) continue;   // no parameters (losses without weights)
      counted.emplace(p.name, h.rank, h.device);
      ranks[{p.name, h.device}].insert(h.rank);
    }
    for (const auto& [key, r] : ranks) two_ranks += r.size() > 1;
    auto l = lower(plan, f.model, f.graph);
    REQUIRE(l.ok());
    for (const auto& [key, devices] : l->shard_devices)
      for (int d : devices) lowered.emplace(key.first, key.second, d);
    REQUIRE_FALSE(counted.empty());
    CHECK(counted == lowered);
  }
  CHECK(two_ranks > 0);
}

