// spindle-profile --measure's library (libexec/profile/measure.h) on one
// process: timing one operator, what a TP shard's run records, the modelled
// communication inside an operator, message sizes, and a whole measured
// profile of tiny-clip that reads back, validates and plans.
#include <catch2/catch.hpp>

#include "libexec/backend/backend.h"
#include "libexec/comm/fake_comm.h"
#include "libexec/profile/measure.h"
#include "libplan/cost/analytic.h"
#include "libplan/cost/cost_model.h"
#include "libplan/plan/check.h"
#include "libplan/planner/planner.h"

namespace sp = spindle::plan;
namespace se = spindle::exec;

namespace {

// Fast settings: the tests check behaviour, not speed.
se::MeasureOptions quick() {
  se::MeasureOptions o;
  o.warmup = 1;
  o.min_repeats = 3;
  o.max_repeats = 5;
  o.point_budget_ms = 1;
  o.passes = 3;
  return o;
}

se::MeasureTarget layer(int tp) {
  se::MeasureTarget t;
  t.workload.op = "transformer_layer";
  t.workload.dims = {{"hidden", 32}, {"heads", 4}, {"ffn", 64}, {"causal", false}};
  t.workload.seq = 8;
  t.workload.batch = 12;
  t.tensor_parallel = tp;
  t.max_seq = 8;
  t.counts = {tp, 2 * tp};
  return t;
}

std::string config(const std::string& rel) { return std::string(SPINDLE_SOURCE_DIR) + "/configs/" + rel; }

}  // namespace

TEST_CASE("time_operator times forward+backward with at least min_repeats runs", "[profile][measure]") {
  auto backend = se::make_backend("cpu");
  const se::OpTiming t = se::time_operator(layer(1), 2, *backend, quick());
  CHECK(t.repeats >= 3);
  CHECK(t.repeats <= 5);
  CHECK(t.compute_ms.median > 0);
  CHECK(t.compute_ms.p10 <= t.compute_ms.median);
  CHECK(t.compute_ms.median <= t.compute_ms.p90);
  CHECK(t.tp.allreduce_floats.empty());
  // The forward of each run, timed on its own: a part of that run.
  REQUIRE(t.forward_samples_ms.size() == t.samples_ms.size());
  for (size_t i = 0; i < t.samples_ms.size(); ++i) {
    CHECK(t.forward_samples_ms[i] > 0);
    CHECK(t.forward_samples_ms[i] < t.samples_ms[i]);
  }
}

TEST_CASE("a TP shard records its collectives: 4 all-reduces of the local activations", "[profile][measure]") {
  // tensor_parallel 2 on 2 devices: one TP group, local batch 12 * 2 / 2 = 12
  // rows of [8, 32]: 2 all-reduces forward, 2 backward (ops/transformer_layer).
  auto backend = se::make_backend("cpu");
  const se::OpTiming t = se::time_operator(layer(2), 2, *backend, quick());
  REQUIRE(t.tp.allreduce_floats.size() == 4);
  for (int64_t f : t.tp.allreduce_floats) CHECK(f == 12 * 8 * 32);
  // Their cost over a 5 GB/s, 20 us link, ring of 2: 2 * 1/2 * bytes / bw + 2 * latency each.
  sp::Cluster c;
  c.islands = 1;
  c.devices_per_island = 2;
  c.intra_island = {5, 20};
  c.inter_island = {1, 50};
  const double bytes = 12 * 8 * 32 * 4.0;
  CHECK(se::op_comm_ms(layer(2), 2, t.tp, c) == Approx(4 * (bytes / 5e9 * 1e3 + 0.04)));
}

TEST_CASE("contrastive_loss: full batch on every count, plus the gather of both embeddings", "[profile][measure]") {
  se::MeasureTarget t;
  t.workload.op = "contrastive_loss";
  t.workload.dims = {{"dim", 16}, {"temperature", 0.07}};
  t.workload.seq = 1;
  t.workload.batch = 24;
  t.counts = {1, 2};
  sp::Cluster c;
  c.islands = 1;
  c.devices_per_island = 2;
  c.intra_island = {5, 20};
  c.inter_island = {1, 50};
  CHECK(se::op_comm_ms(t, 1, {}, c) == 0.0);
  // n = 2: each rank holds 12 rows of 16 floats = 768 bytes; a ring all-gather
  // is (n-1) (bytes / bw + latency) = 768 / 5e9 s + 20 us; two of them.
  CHECK(se::op_comm_ms(t, 2, {}, c) == Approx(2 * (768 / 5e9 * 1e3 + 0.02)));
  auto backend = se::make_backend("cpu");
  CHECK(se::time_operator(t, 2, *backend, quick()).compute_ms.median > 0);
}

TEST_CASE("link_message_sizes spans the model's gradient and transfer sizes", "[profile][measure]") {
  se::MeasureTarget t = layer(1);
  sp::ProfileEntry e;
  e.param_bytes = 6000000;
  // Transfers: output 8 x 32 fp32 = 1024 bytes per sample, x 12 / 2 = 6144 bytes.
  const auto sizes = se::link_message_sizes({t}, {e}, sp::DType::fp32, 6);
  REQUIRE(sizes.size() == 6);
  CHECK(sizes.front() == 6144);
  CHECK(sizes.back() == 6000000);
  // Small models: the largest size is raised to 4 MiB, so that the fit sees
  // the bandwidth term above timing noise (6144 .. 4194304 bytes).
  e.param_bytes = 100000;
  const auto small = se::link_message_sizes({t}, {e}, sp::DType::fp32, 6);
  REQUIRE(small.size() == 6);
  CHECK(small.front() == 6144);
  CHECK(small.back() == 4194304);
  for (size_t i = 1; i < sizes.size(); ++i) CHECK(sizes[i] > sizes[i - 1]);
  for (double s : sizes) CHECK(std::fmod(s, 4.0) == 0.0);
}

TEST_CASE("expected_point_ms: warm-up runs, then timed runs to the budget within the repeat bounds",
          "[profile][measure]") {
  se::MeasureOptions o;   // per call: 3 warm-up, 6..300 timed, 120 ms
  CHECK(se::expected_point_ms(1.0, o) == 1.0 * (3 + 120));     // the budget: 120 runs
  CHECK(se::expected_point_ms(100.0, o) == 100.0 * (3 + 6));   // past it at once: the minimum
  CHECK(se::expected_point_ms(0.1, o) == Approx(0.1 * (3 + 300)));   // the budget needs 1200: the maximum
  CHECK(se::expected_point_ms(7.0, o) == 7.0 * (3 + 18));      // 18 runs reach 126 ms, 17 only 119
  CHECK(se::expected_point_ms(0.0, o) == 0);
  CHECK(se::expected_point_ms(-1.0, o) == 0);
}

TEST_CASE("a measured profile of tiny-clip reads back, validates and plans", "[profile][measure]") {
  auto model = sp::load_model(config("models/tiny-clip.yaml"));
  REQUIRE(model.ok());
  auto cluster = sp::load_cluster(config("clusters/cpu-1x4.yaml"));
  REQUIRE(cluster.ok());
  const sp::OpGraph graph = sp::expand(*model);
  const std::vector<int> counts{1, 2, 4};
  auto skeleton = sp::analytic_profile(*model, graph, *cluster, &counts);
  REQUIRE(skeleton.ok());
  se::SelfComm world;
  auto backend = se::make_backend("cpu");
  int calls = 0, last_done = -1, total = 0;
  double first_left_s = -1, last_left_s = -1;
  auto report = se::measure_profile(*model, graph, *skeleton, *cluster, world, *backend, quick(),
                                    [&](const se::MeasureProgress& p) {
                                      ++calls;
                                      CHECK(p.done >= last_done);
                                      CHECK(p.left_s >= 0);
                                      if (p.total > 0 && p.done == 0 && first_left_s < 0) first_left_s = p.left_s;
                                      last_done = p.done;
                                      last_left_s = p.left_s;
                                      total = p.total;
                                    });
  REQUIRE(report.ok());
  const sp::Profile& p = report->profile;
  CHECK(p.source == "measured");
  CHECK_FALSE(p.links);   // one rank: no links measured
  // The optimizer's rate, timed (Backend::adamw_step): a positive figure,
  // far below any memory system's 10 TB/s.
  REQUIRE(p.optimizer_gbytes_per_s.has_value());
  CHECK(*p.optimizer_gbytes_per_s > 0);
  CHECK(*p.optimizer_gbytes_per_s < 1e4);
  REQUIRE(p.entries.size() == skeleton->entries.size());
  int points = 0;
  for (size_t i = 0; i < p.entries.size(); ++i) {
    CHECK(p.entries[i].workload.key() == skeleton->entries[i].workload.key());
    CHECK(p.entries[i].param_bytes == skeleton->entries[i].param_bytes);
    REQUIRE(p.entries[i].points.size() == skeleton->entries[i].points.size());
    for (const auto& pt : p.entries[i].points) {
      CHECK(pt.ms > 0);
      CHECK(pt.spread >= 0);
      ++points;
    }
    // Every entry measured its forward's share (x-forward_share).
    CHECK(p.entries[i].forward_share > 0);
    CHECK(p.entries[i].forward_share < 1);
  }
  // A data reader draws its batch in the forward and has no input
  // gradient to compute: most of its time is forward; a transformer
  // layer's backward costs more than its forward (two matmuls per one).
  // Compared with each other, not with 0.5: measured times, and under the
  // sanitizers a layer's forward (allocation-heavy there) once took 53% of
  // the layer's time (2026-12-06). The shares are measured per entry, so
  // the two differ by a wide margin either way.
  auto share_of = [&](const std::string& op) {
    for (const sp::ProfileEntry& e : p.entries)
      if (e.workload.op == op) return e.forward_share;
    return -1.0;
  };
  INFO("forward shares: patch_embed " << share_of("patch_embed") << ", transformer_layer "
                                      << share_of("transformer_layer"));
  CHECK(share_of("patch_embed") > 0.5);
  CHECK(share_of("patch_embed") > share_of("transformer_layer") + 0.1);
  // Every point once per pass (quick(): 3 passes), then the final "done".
  CHECK(report->points == points);
  CHECK(total == 3 * points);
  CHECK(last_done == 3 * points);
  CHECK(calls == 3 * points + 1);
  // The time left before the first point is the analytic estimate: quick()
  // split over 3 passes runs each point once warm and once timed per pass
  // (warm-up 1, at least 1 and at most 1 timed run), 6 runs of its
  // analytic time in all, on this one rank. At the end nothing is left.
  double analytic_ms = 0;
  for (const sp::ProfileEntry& e : skeleton->entries)
    for (const sp::ProfilePoint& pt : e.points) analytic_ms += pt.ms;
  REQUIRE(analytic_ms > 0);
  CHECK(first_left_s == Approx(6 * analytic_ms / 1e3).epsilon(1e-9));
  CHECK(last_left_s == 0);

  // Reads back as a valid profile and plans.
  const std::string bytes = sp::profile_to_json(p);
  auto back = sp::parse_profile_string(bytes, "measured.json");
  REQUIRE(back.ok());
  CHECK(back->source == "measured");
  for (size_t i = 0; i < p.entries.size(); ++i)
    CHECK(back->entries[i].forward_share == Approx(p.entries[i].forward_share).epsilon(1e-5));   // 6 digits
  auto cost = sp::ProfileCostModel::create(*back, *cluster, graph);
  REQUIRE(cost.ok());
  REQUIRE(back->optimizer_gbytes_per_s.has_value());
  CHECK(*back->optimizer_gbytes_per_s == Approx(*p.optimizer_gbytes_per_s).epsilon(1e-5));
  CHECK((*cost)->optimizer_ms(1'000'000) == Approx(28e6 / (*back->optimizer_gbytes_per_s * 1e6)));
  sp::PlanRequest req{&*model, &graph, &*cluster, cost->get(), back->sha256, sp::Strategy::spindle};
  auto plan = sp::make_plan(req);
  REQUIRE(plan.ok());
  CHECK(sp::check_plan_status(*plan, *model, graph, "plan.json").ok());
  CHECK(plan->predicted.iteration_ms > 0);
}
