// Multitask-CLIP-like models on the analytic profile: validity, gap to the
// relaxed optimum, planning time. The hidden [.bench] case prints figures;
// bench/ owns the real measurements.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "libplan/cost/analytic.h"
#include "libplan/plan/check.h"
#include "libplan/planner/planner.h"
#include "test/plan/shipped_fixture.h"
#include "libplan/sim/sim.h"

using namespace spindle::plan;

namespace {

struct Modality {
  const char* name;
  const char* embed;   // YAML of the first block
  int hidden, layers, heads, seq;
  bool causal;
};

const Modality kModalities[] = {
    {"vision", "{op: patch_embed, in_dim: 588, hidden: 1280}", 1280, 32, 16, 257, false},
    {"text", "{op: token_embed, vocab: 49408, hidden: 1024}", 1024, 24, 16, 77, true},
    {"audio", "{op: patch_embed, in_dim: 256, hidden: 768}", 768, 12, 12, 229, false},
    {"depth", "{op: patch_embed, in_dim: 196, hidden: 384}", 384, 12, 8, 197, false},
    {"thermal", "{op: patch_embed, in_dim: 196, hidden: 768}", 768, 12, 12, 197, false},
    {"imu", "{op: patch_embed, in_dim: 48, hidden: 512}", 512, 6, 8, 251, false},
};

// `tasks` contrastive tasks over modality pairs, batches cycling through a
// few sizes. ImageBind-huge encoder sizes (docs/workloads.md).
std::string clip_yaml(int tasks) {
  std::ostringstream y;
  y << "name: clip-" << tasks << "\nmodules:\n";
  for (const Modality& m : kModalities) {
    y << "  " << m.name << ":\n    - " << m.embed << "\n"
      << "    - {op: transformer_layer, repeat: " << m.layers << ", hidden: " << m.hidden
      << ", heads: " << m.heads << ", ffn: " << 4 * m.hidden
      << (m.causal ? ", causal: true" : "") << "}\n"
      << "    - {op: pool_project, in: " << m.hidden << ", out: 1024}\n";
  }
  y << "  clip_loss:\n    - {op: contrastive_loss, dim: 1024}\ntasks:\n";
  const int pairs[][2] = {{0, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1},
                          {0, 2}, {0, 3}, {0, 4}, {0, 5}, {2, 5}};
  const int batches[] = {256, 128, 512, 64, 192};
  for (int t = 0; t < tasks; ++t) {
    const Modality& a = kModalities[pairs[t % 10][0]];
    const Modality& b = kModalities[pairs[t % 10][1]];
    y << "  - name: " << a.name << "-" << b.name << "-" << t << "\n"
      << "    batch: " << batches[t % 5] << "\n    nodes:\n"
      << "      - {id: a, module: " << a.name << ", seq: " << a.seq << "}\n"
      << "      - {id: b, module: " << b.name << ", seq: " << b.seq << "}\n"
      << "      - {id: l, module: clip_loss, inputs: [a, b]}\n";
  }
  return y.str();
}

struct Outcome {
  double gap = 0;             // wave-barrier compute (sum of wave ms) over the relaxed optimum
  double simulated_gap = 0;   // simulated_compute_gap
  double planning_ms = 0;
  double compute_ms = 0;
  double relaxed_ms = 0;
  double transfer_ms = 0;
  double sync_ms = 0;
  size_t waves = 0;
  std::vector<std::string> violations;
};

// The halving of the islands (plan_beating, docs/planner.md "Fewer
// islands") in `plan`'s shares_planned, for a plan on `islands`: the first
// share the whole cluster, each next one half the one before, and one is
// planned after a share only when that share is at most 10%
// (kHalvingSlack) slower than the fastest before it.
void check_shares(const Plan& plan, int islands) {
  const std::vector<Plan::Share>& sh = plan.shares_planned;
  INFO("a plan on " << islands << " islands, " << sh.size() << " shares planned");
  REQUIRE(sh.size() >= 2);   // every caller's cluster has 16 islands or more
  CHECK(sh[0].islands == islands);
  double best = sh[0].ms;
  for (size_t i = 1; i < sh.size(); ++i) {
    CHECK(sh[i].islands * 2 == sh[i - 1].islands);
    if (i + 1 < sh.size()) CHECK(sh[i].ms <= best * 1.1);
    best = std::min(best, sh[i].ms);
  }
}

Outcome plan_clip(int tasks, int islands, Strategy strategy, bool start_early) {
  Result<Model> model = parse_model_string(clip_yaml(tasks), "clip.yaml");
  REQUIRE(model.ok());
  const OpGraph graph = expand(*model);
  Result<Cluster> a800 = load_cluster(SPINDLE_SOURCE_DIR "/configs/clusters/a800-8x8.yaml");
  REQUIRE(a800.ok());
  Cluster cluster = *a800;
  cluster.islands = islands;
  Result<Profile> profile = analytic_profile(*model, graph, cluster);
  REQUIRE(profile.ok());
  auto cost = ProfileCostModel::create(*profile, cluster, graph);
  REQUIRE(cost.ok());
  PlanRequest req{&*model, &graph, &cluster, cost->get(), "", strategy, start_early};
  Result<Plan> plan = make_plan(req);
  REQUIRE(plan.ok());
  Outcome o;
  o.compute_ms = plan->predicted.compute_ms;
  o.relaxed_ms = plan->predicted.relaxed_optimum_ms;
  o.transfer_ms = plan->predicted.transfer_ms;
  o.sync_ms = plan->predicted.sync_ms;
  o.gap = o.compute_ms / o.relaxed_ms;
  const Result<double> sim_gap = simulated_compute_gap(*plan, *model, graph, *cost->get());
  REQUIRE(sim_gap.ok());
  o.simulated_gap = *sim_gap;
  o.planning_ms = plan->planning_ms;
  o.waves = plan->waves.size();
  o.violations = check_plan(*plan, *model, graph);
  return o;
}

}  // namespace

TEST_CASE("10-task CLIP on 64 devices: valid plans, Spindle beats sequential", "[planner][clip]") {
  const Outcome sp = plan_clip(10, 8, Strategy::spindle, false);
  CHECK(sp.violations == std::vector<std::string>{});   // prints them when not
  CHECK(sp.gap >= 1 - 1e-9);
  // Packed within 10% of the relaxed optimum on the simulated timeline
  // (4.2% on 2026-12-03). Not on the sum of the wave times: boundary shifts
  // lengthen a wave's longest slice where that shortens the simulated
  // makespan (that sum came to 11.2% with the cyclic shift scan).
  CHECK(sp.simulated_gap <= 0.10);
  const Outcome early = plan_clip(10, 8, Strategy::spindle, true);
  CHECK(early.violations == std::vector<std::string>{});
  CHECK(early.compute_ms <= sp.compute_ms);   // it also tries the level-by-level plans
  const Outcome seq = plan_clip(10, 8, Strategy::sequential, false);
  CHECK(seq.violations == std::vector<std::string>{});
  CHECK(sp.compute_ms < seq.compute_ms);
}

TEST_CASE("10-task CLIP, batch fixed: 16 and 32 islands are never slower than 8", "[planner][clip][scale]") {
  // One profile (made for the largest cluster) for every cluster size, so
  // the plans differ only in the islands they may use. Beyond 8 islands the
  // batch runs out: Spindle on 16 islands would spread the same work's
  // gradient all-reduces over more islands; it also plans on the first 8
  // and keeps that plan (the other devices idle) when it is faster.
  Result<Model> model = parse_model_string(clip_yaml(10), "clip.yaml");
  REQUIRE(model.ok());
  const OpGraph graph = expand(*model);
  Result<Cluster> a800 = load_cluster(SPINDLE_SOURCE_DIR "/configs/clusters/a800-8x8.yaml");
  REQUIRE(a800.ok());
  Cluster largest = *a800;
  largest.islands = 32;
  Result<Profile> profile = analytic_profile(*model, graph, largest);
  REQUIRE(profile.ok());
  auto plan_on = [&](int islands, bool fewer, bool choose_cap = true) {
    Cluster cluster = *a800;
    cluster.islands = islands;
    auto cost = ProfileCostModel::create(*profile, cluster, graph);
    REQUIRE(cost.ok());
    PlanRequest req{&*model, &graph, &cluster, cost->get(), "", Strategy::spindle};
    req.fewer_islands = fewer;
    req.choose_bucket_bytes = choose_cap;
    Result<Plan> plan = make_plan(req);
    REQUIRE(plan.ok());
    CHECK(plan->devices == cluster.devices());
    CHECK(check_plan(*plan, *model, graph) == std::vector<std::string>{});
    return *plan;
  };
  const Plan on8 = plan_on(8, true), on16 = plan_on(16, true), on32 = plan_on(32, true);
  CHECK(on16.predicted.simulated_ms <= on8.predicted.simulated_ms);
  CHECK(on32.predicted.simulated_ms <= on16.predicted.simulated_ms);
  auto highest_device = [](const Plan& plan) {
    int highest = 0;
    for (const Wave& w : plan.waves)
      for (const Slice& sl : w.slices) highest = std::max(highest, *std::max_element(sl.devices.begin(), sl.devices.end()));
    return highest;
  };
  // The bucket caps chosen (docs/planner.md, "Bucket cap"), the shares are
  // compared at their best caps: larger buckets pay the wide all-reduces'
  // latency fewer times, and 16 islands' own plan wins (209.4 ms against
  // 224.0 for 8 islands').
  CHECK(highest_device(on16) >= 64);
  CHECK(on16.predicted.simulated_ms < on8.predicted.simulated_ms);
  check_shares(on32, 32);
  check_shares(on16, 16);
  CHECK(on8.shares_planned.empty());   // fewer than 16 islands: no halving
  // On 32 islands the half (16) simulates about 48% slower than the whole,
  // so the quarter (8 islands) is not planned; that lost nothing here: the
  // first 8 islands' own plan is slower still (above: on32 <= on16 < on8).
  REQUIRE(on32.shares_planned.size() == 2);
  CHECK(on32.shares_planned[1].ms > 1.1 * on32.shares_planned[0].ms);
  // With 25 MiB buckets throughout, 16 islands alone are slower than 8
  // here: what the rule is for. With the smaller plans, the plan kept on 16
  // islands is 8 islands' plan (its slices on devices 0-63 only). Three
  // more plans, two on 128 devices: left to the normal pass (the same code
  // as above under the sanitizers).
  if (spindle::plan::testing::sanitized_run()) return;
  const Plan fixed8 = plan_on(8, true, false), fixed16 = plan_on(16, true, false);
  const Plan all16 = plan_on(16, false, false);
  CHECK(all16.predicted.simulated_ms > fixed8.predicted.simulated_ms);
  CHECK(highest_device(fixed16) < 64);
  CHECK(fixed16.predicted.simulated_ms == fixed8.predicted.simulated_ms);
  CHECK(on8.predicted.simulated_ms <= fixed8.predicted.simulated_ms);
}

TEST_CASE("planner figures: gap and planning time", "[.bench]") {
  struct Case {
    int tasks, islands;
  };
  for (const Case c : {Case{10, 8}, Case{10, 2}, Case{50, 128}}) {
    for (bool early : {false, true}) {
      const Outcome o = plan_clip(c.tasks, c.islands, Strategy::spindle, early);
      std::printf("spindle%s %2d tasks %4d devices: gap %.4f (compute %.2f ms, relaxed %.2f ms), "
                  "%zu waves, transfer %.2f ms, sync %.2f ms, planning %.2f ms, %zu violations\n",
                  early ? "+early" : "(level)", c.tasks, c.islands * 8, o.gap, o.compute_ms,
                  o.relaxed_ms, o.waves, o.transfer_ms, o.sync_ms, o.planning_ms,
                  o.violations.size());
      for (size_t i = 0; i < o.violations.size() && i < 3; ++i)
        std::printf("  violation: %s\n", o.violations[i].c_str());
    }
    const Outcome s = plan_clip(c.tasks, c.islands, Strategy::sequential, false);
    std::printf("sequential    %2d tasks %4d devices: compute %.2f ms (%.3fx of relaxed), "
                "transfer %.2f ms, sync %.2f ms\n",
                c.tasks, c.islands * 8, s.compute_ms, s.compute_ms / s.relaxed_ms, s.transfer_ms,
                s.sync_ms);
  }
}
