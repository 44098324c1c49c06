// Every shipped workload on every shipped cluster, from the shipped profile:
// the profile is current (regenerating it gives the same bytes), the plan
// obeys every rule, two plannings give the same bytes, and the compute time is
// near the relaxed optimum for the paper's workloads: within the paper's 7%
// plus the 1% of compute the planner may trade for shorter transfers and
// gradient sync (it keeps the schedule with the shortest predicted
// iteration among those within 1% of the shortest compute). Our 3% target
// is reported by bench/plan_time, not asserted here.
#include <catch2/catch.hpp>

#include <filesystem>

#include "libplan/cost/analytic.h"
#include "libplan/cost/cost_model.h"
#include "libplan/io/profile.h"
#include "libplan/plan/check.h"
#include "libplan/plan/plan_io.h"
#include "libplan/planner/feasibility.h"
#include "libplan/planner/planner.h"
#include "test/plan/shipped_fixture.h"

namespace sp = spindle::plan;

using sp::testing::as_first_attempt;
namespace fs = std::filesystem;

TEST_CASE("shipped workloads plan validly, deterministically, near the relaxed optimum", "[shipped]") {
  const fs::path root = SPINDLE_SOURCE_DIR;
  int planned = 0;
  for (const auto& entry : fs::directory_iterator(root / "profiles")) {
    if (entry.path().extension() != ".json") continue;
    // profiles/<model>.<cluster>.json
    const std::string stem = entry.path().stem().string();
    const std::string model_name = stem.substr(0, stem.find('.'));
    const std::string cluster_name = stem.substr(stem.find('.') + 1);
    if (sp::testing::profile_left_out_when_sanitized(model_name, cluster_name)) continue;
    INFO(model_name << " on " << cluster_name);

    auto model = sp::load_model((root / "configs/models" / (model_name + ".yaml")).string());
    REQUIRE(model.ok());
    auto cluster = sp::load_cluster((root / "configs/clusters" / (cluster_name + ".yaml")).string());
    REQUIRE(cluster.ok());
    auto profile = sp::load_profile(entry.path().string());
    REQUIRE(profile.ok());
    const sp::OpGraph graph = sp::expand(*model);

    // The shipped profile is what spindle-profile --analytic writes today.
    auto fresh = sp::analytic_profile(*model, graph, *cluster);
    REQUIRE(fresh.ok());
    CHECK(sp::profile_to_json(*fresh) == sp::profile_to_json(*profile));

    auto cost = sp::ProfileCostModel::create(*profile, *cluster, graph);
    REQUIRE(cost.ok());
    for (sp::Strategy s : {sp::Strategy::spindle, sp::Strategy::sequential}) {
      INFO(sp::strategy_name(s));
      sp::PlanRequest req{&*model, &graph, &*cluster, cost->get(), profile->sha256, s};
      // A few boundary shifts (test_shift.cpp plans with the default): every
      // shipped workload is planned four times here (three under the
      // sanitizers).
      req.shift_simulations = 8;
      sp::testing::first_search_when_sanitized(req);
      auto a = sp::make_plan(req);
      REQUIRE(a.ok());
      auto violations = sp::check_plan(*a, *model, graph);
      CHECK(violations.empty());
      for (const auto& v : violations) UNSCOPED_INFO(v);
      auto b = sp::make_plan(req);
      REQUIRE(b.ok());
      CHECK(sp::plan_to_json(*a) == sp::plan_to_json(*b));
      // The gap bound is for the paper's workloads; the tiny test models have
      // a handful of operators per level, too few for any wave plan to fill
      // devices as evenly as the relaxed problem does.
      if (s == sp::Strategy::spindle && model_name.rfind("tiny-", 0) != 0) {
        // Spindle's own portfolio on the paper's allocation (the bound is
        // the paper's, on its schedules; with the baselines' schedules or
        // the communication-aware allocation among the candidates the
        // planner may keep one that simulates faster at a larger compute
        // gap: task-level on ofasys-7 with 32 and 64 devices, capped
        // MetaOps on 64 devices).
        req.baseline_candidates = false;
        req.comm_aware_candidates = false;
        // And as scheduled: boundary shifts lengthen some waves (the
        // wave-barrier compute this bound is on) to shorten the run.
        req.shift_simulations = 0;
        // At one bucket cap: the candidates are compared at the request's
        // (25 MiB), and the cap chosen after can favour a plan that lost
        // there (multitask-clip-4 on a800-8x8: this restricted plan 153.4
        // ms at 200 MiB, the full search's 164.7 at 400; docs/planner.md,
        // "Bucket cap").
        req.choose_bucket_bytes = false;
        // And with the state as auto's first attempt (replicated, placed
        // counting it sharded): auto then shards a plan that simulates
        // faster so, which is no property of the search.
        as_first_attempt(req);
        auto own = sp::make_plan(req);
        REQUIRE(own.ok());
        const double gap = own->predicted.compute_ms / own->predicted.relaxed_optimum_ms - 1.0;
        CHECK(gap >= -1e-9);   // the relaxed optimum is a lower bound
        CHECK(gap <= 0.07 + 0.01);
        // The full search at that cap too: never slower; and the cap chosen
        // after it never makes it slower (a fourth plan of each workload,
        // left to the normal pass).
        if (!sp::testing::sanitized_run()) {
          req = sp::PlanRequest{&*model, &graph, &*cluster, cost->get(), profile->sha256, s};
          req.shift_simulations = 8;
          req.choose_bucket_bytes = false;
          as_first_attempt(req);
          auto fixed = sp::make_plan(req);
          REQUIRE(fixed.ok());
          CHECK(fixed->predicted.simulated_ms <= own->predicted.simulated_ms);
          // Where it fits replicated (by its own count, and sharding is
          // not what would let it run on GPUs), auto's plan is this one
          // with its cap chosen and, when faster, its state sharded; where
          // it does not, auto's plan is sharded.
          if (sp::check_plan_memory(*fixed, *model).ok() && !sp::sharding_fits_on_gpus(*fixed, *model, graph))
            CHECK(a->predicted.simulated_ms <= fixed->predicted.simulated_ms);
          else
            CHECK(a->optimizer_state == sp::OptimizerState::sharded);
        }
      }
    }
    ++planned;
  }
  CHECK(planned >= (sp::testing::sanitized_run() ? 15 : 25));
}
