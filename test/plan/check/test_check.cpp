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

  // No `return` inside a SECTION: it would leave the test case, and Catch2
  // would never reach (nor run) the sections after it.
  SECTION("rule 1: operators covered exactly once, in order") {
    sp::Plan p = good;
    // A slice of more than one operator shortened, else the last wave's
    // first slice dropped.
    const auto shorten = [&] {
      for (auto& w : p.waves)
        for (auto& s : w.slices)
          if (s.count > 1) {
            s.count -= 1;
            return true;
          }
      return false;
    };
    if (!shorten()) p.waves.back().slices.erase(p.waves.back().slices.begin());
    CHECK(f.flags(p, "rule 1"));
  }
  SECTION("rule 2: a MetaOp after its inputs") {
    sp::Plan p = good;
    // The loss of the first task depends on its encoders: move it to wave 0.
    int loss = -1;
    for (const auto& m : p.metaops)
      if (m.workload.op == "contrastive_loss") loss = m.id;
    REQUIRE(loss >= 0);
    const auto move_to_wave_0 = [&] {
      for (auto& w : p.waves)
        for (size_t i = 0; i < w.slices.size(); ++i)
          if (w.slices[i].metaop == loss) {
            sp::Slice s = w.slices[i];
            w.slices.erase(w.slices.begin() + static_cast<long>(i));
            s.devices = {3};
            p.waves[0].slices.push_back(s);
            return true;
          }
      return false;
    };
    REQUIRE(move_to_wave_0());
    CHECK(f.flags(p, "rule 2"));
  }
  SECTION("rule 3: disjoint devices inside the cluster") {
    sp::Plan p = good;
    p.waves[0].slices[0].devices.push_back(p.devices);
    CHECK(f.flags(p, "rule 3"));
  }
  SECTION("rule 4: the data-parallel size (devices / tensor_parallel) divides the batch") {
    sp::Plan p = good;
    // A slice on n >= 2 devices of a MetaOp without tensor parallelism
    // (tiny-clip has none), its batch claimed to be n + 1: n does not divide it.
    const sp::Slice* wide = nullptr;
    for (const auto& w : p.waves)
      for (const auto& s : w.slices)
        if (!wide && s.devices.size() >= 2 && p.metaops[static_cast<size_t>(s.metaop)].tensor_parallel == 1) wide = &s;
    REQUIRE(wide != nullptr);
    p.metaops[static_cast<size_t>(wide->metaop)].workload.batch = static_cast<int64_t>(wide->devices.size()) + 1;
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
