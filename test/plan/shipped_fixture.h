// A shipped model planned on a shipped cluster from its analytic profile,
// shared by the plan IO and checker tests.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "libplan/cost/analytic.h"
#include "libplan/cost/cost_model.h"
#include "libplan/plan/check.h"
#include "libplan/planner/planner.h"

namespace spindle::plan::testing {

namespace sp = spindle::plan;

// Whether this is scripts/test.sh's sanitizer pass (it sets
// SPINDLE_TEST_SANITIZED=1 there).
inline bool sanitized_run() {
  const char* v = std::getenv("SPINDLE_TEST_SANITIZED");
  return v != nullptr && std::string(v) == "1";
}

// Under the sanitizers the tests over shipped workloads keep the clusters
// of one island and of four (cpu-*, a800-1x8, a800-4x8: the same code on
// fewer and smaller plans) and leave the others, the 64-device ones the
// slowest, to the normal pass, which runs every profile. Whether the
// profiles of `cluster_name` are left out now.
inline bool left_out_when_sanitized(const std::string& cluster_name) {
  return sanitized_run() && (cluster_name == "a800-2x8" || cluster_name == "a800-8x8" || cluster_name == "h200-1x8");
}

// The loops over every shipped profile keep, of a800-4x8, only the two
// models that plan there fastest (multitask-clip-4: several tasks sharing
// encoders; qwen-val-3: a TP trunk), so the four-island paths still run
// sanitized: the other three cost about four times as much to plan
// (ofasys-7 alone half of it) and run the same code on larger plans: 16 of
// the 34 profiles, against 19 (bench/plan_time's spindle plans of the five
// on a800-4x8: 53, 51 against 72, 72 and 275 ms).
inline bool profile_left_out_when_sanitized(const std::string& model_name, const std::string& cluster_name) {
  return left_out_when_sanitized(cluster_name) ||
         (sanitized_run() && cluster_name == "a800-4x8" && model_name != "multitask-clip-4" &&
          model_name != "qwen-val-3");
}

// And they plan with --optimizer-state auto's first search alone: its
// second, sharded one (PlanRequest::sharded_search_metaops) runs the same
// search code again on about a third of them, and is left to the normal
// pass (test_planner checks both sides of its rule in both passes).
inline void first_search_when_sanitized(sp::PlanRequest& request) {
  if (sanitized_run()) request.sharded_search_metaops = 0;
}

// The request as --optimizer-state auto's first attempt makes it
// (make_plan): replicated, placed counting the state sharded.
inline void as_first_attempt(sp::PlanRequest& request) {
  request.choose_optimizer_state = false;
  request.optimizer_state = sp::OptimizerState::replicated;
  request.placement_state = sp::OptimizerState::sharded;
}

struct Fixture {
  sp::Model model;
  sp::Cluster cluster;
  sp::OpGraph graph;
  sp::Profile profile;
  std::unique_ptr<sp::ProfileCostModel> cost;

  explicit Fixture(const std::string& model_name = "tiny-clip", const std::string& cluster_name = "cpu-1x4") {
    const std::string root = SPINDLE_SOURCE_DIR;
    model = sp::load_model(root + "/configs/models/" + model_name + ".yaml").value();
    cluster = sp::load_cluster(root + "/configs/clusters/" + cluster_name + ".yaml").value();
    graph = sp::expand(model);
    profile = sp::analytic_profile(model, graph, cluster).value();
    cost = std::move(sp::ProfileCostModel::create(profile, cluster, graph).value());
  }

  // With a few boundary shifts (test_shift.cpp plans with the default).
  sp::Plan plan(sp::Strategy s = sp::Strategy::spindle) const {
    sp::PlanRequest request{&model, &graph, &cluster, cost.get(), "", s};
    request.shift_simulations = 8;
    auto p = sp::make_plan(request);
    REQUIRE(p.ok());
    return *p;
  }

  bool flags(const sp::Plan& p, const std::string& fragment) const {
    auto v = sp::check_plan(p, model, graph);
    return std::any_of(v.begin(), v.end(), [&](const std::string& m) { return m.find(fragment) != std::string::npos; });
  }
};


}  // namespace spindle::plan::testing
