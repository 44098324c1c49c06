// The plan checker: every rule of spec/plan.md.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "test/plan/shipped_fixture.h"
#include "libplan/plan/check.h"
#include "libplan/plan/plan_io.h"
#include "libplan/planner/planner.h"

namespace sp = spindle::plan;

using spindle::plan::testing::Fixture;

TEST_CASE("plan checker: a valid plan passes and every rule is enforced", "[check]") {
  Fixture f;
  const sp::Plan good = f.plan();
  REQUIRE(sp::check_plan(good, f.model, f.graph).empty());

  SECTION("rule 1: operators covered exactly once, in order") {
    sp::Plan p = good;
    // Find a slice of more than one operator and shorten it.
    for (auto& w : p.waves)
      for (auto& s : w.slices)
        if (s.count > 1) {
          s.count -= 1;
          CHECK(f.flags(p, "rule 1"));
          return;
        }
    // Otherwise drop the last wave's first slice.
    p.waves.back().slices.erase(p.waves.back().slices.begin());
    CHECK(f.flags(p, "rule 1"));
  }
  SECTION("rule 2: a MetaOp after its inputs") {
    sp::Plan p = good;
    // The loss of the first task depends on its encoders: move it to wave 0.
    int loss = -1;
    for (const auto& m : p.metaops)
      if (m.workload.op == "contrastive_loss") loss = m.id;
    REQUIRE(loss >= 0);
    for (auto& w : p.waves)
      for (size_t i = 0; i < w.slices.size(); ++i)
        if (w.slices[i].metaop == loss) {
          sp::Slice s = w.slices[i];
          w.slices.erase(w.slices.begin() + static_cast<long>(i));
          s.devices = {3};
          p.waves[0].slices.push_back(s);
          CHECK(f.flags(p, "rule 2"));
          return;
        }
  }
  SECTION("rule 3: disjoint devices inside the cluster") {
    sp::Plan p = good;
    p.waves[0].slices[0].devices.push_back(p.devices);
    CHECK(f.flags(p, "rule 3"));
  }
  SECTION("rule 4: device count divides the batch") {
    sp::Plan p = good;
    // batch 24 or 12 is not divisible by 5... but the cluster has 4 devices:
    // use a count of 4 for a 24-batch slice after changing the batch claim.
    p.metaops[p.waves[0].slices[0].metaop].workload.batch = 7;
    CHECK(f.flags(p, "rule 4"));
  }
  SECTION("rule 5: param groups are exactly the devices that run the parameter") {
    sp::Plan p = good;
    p.param_groups[0].devices.push_back(99);
    CHECK(f.flags(p, "rule 5"));
    p = good;
    p.param_groups.pop_back();
    CHECK(f.flags(p, "rule 5"));
  }
  SECTION("rule 6: memory within the device") {
    sp::Plan p = good;
    p.predicted.memory_bytes[1] = p.memory_bytes + 1;
    CHECK(f.flags(p, "rule 6: device 1"));
  }
  SECTION("a plan for another model") {
    sp::Plan p = good;
    p.model_sha256 = std::string(64, '0');
    CHECK(f.flags(p, "model.sha256"));
    CHECK(f.flags(p, "plan it again with spindle-plan"));   // what to do about it
    p = good;
    p.metaops[0].operators[0] = "no-such-task/x/0.0";
    CHECK(f.flags(p, "not an operator of model"));
  }
}

TEST_CASE("plans of every strategy that exists obey the rules", "[check]") {
  Fixture f("tiny-lm", "cpu-1x4");
  for (sp::Strategy s : {sp::Strategy::spindle, sp::Strategy::sequential}) {
    sp::Plan p = f.plan(s);
    INFO(sp::strategy_name(s));
    CHECK(sp::check_plan(p, f.model, f.graph).empty());
  }
}
