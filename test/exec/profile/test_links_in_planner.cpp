// Measured link figures ("x-links") in the profile: round trip through the
// reader and writer, strict validation, and the planner's cost model using
// them in place of the cluster's.
#include <catch2/catch.hpp>

#include "libplan/cost/cost_model.h"
#include "libplan/io/profile.h"

namespace sp = spindle::plan;

namespace {

const char* kProfile = R"({
  "device": "cpu-core",
  "entries": [],
  "format": "spindle-profile",
  "source": "measured",
  "version": 1,
  "x-links": {"intra_island": {"allreduce": {"gbytes_per_s": 2.5, "latency_us": 3},
                               "p2p": {"gbytes_per_s": 4, "latency_us": 1.5}},
              "ranks": 2}
})";

sp::Cluster two_islands() {
  sp::Cluster c;
  c.name = "test";
  c.islands = 2;
  c.devices_per_island = 2;
  c.intra_island = {5, 20};
  c.inter_island = {1, 50};
  return c;
}

}  // namespace

TEST_CASE("x-links reads back and re-encodes to the same bytes", "[profile][links]") {
  auto p = sp::parse_profile_string(kProfile, "m.json");
  REQUIRE(p.ok());
  REQUIRE(p->links);
  CHECK(p->links->ranks == 2);
  CHECK(p->links->intra_p2p.gbytes_per_s == 4);
  CHECK(p->links->intra_p2p.latency_us == 1.5);
  CHECK(p->links->intra_allreduce.gbytes_per_s == 2.5);
  CHECK(p->links->inter_p2p.gbytes_per_s == 0);   // not measured
  const std::string once = sp::profile_to_json(*p);
  auto again = sp::parse_profile_string(once, "m2.json");
  REQUIRE(again.ok());
  CHECK(sp::profile_to_json(*again) == once);
}

TEST_CASE("bad x-links are rejected naming the key", "[profile][links]") {
  std::string bad = kProfile;
  bad.replace(bad.find("\"gbytes_per_s\": 4"), 17, "\"gbytes_per_s\": -4");
  auto p = sp::parse_profile_string(bad, "bad.json");
  REQUIRE_FALSE(p.ok());
  CHECK_THAT(p.error().message, Catch::Contains("bad.json") && Catch::Contains("x-links.intra_island.p2p.gbytes_per_s"));

  std::string typo = kProfile;
  typo.replace(typo.find("\"p2p\""), 5, "\"ptp\"");
  auto q = sp::parse_profile_string(typo, "typo.json");
  REQUIRE_FALSE(q.ok());
  CHECK_THAT(q.error().message, Catch::Contains("x-links.intra_island.ptp"));
}

TEST_CASE("the cost model prefers measured links and keeps the cluster's elsewhere", "[profile][links]") {
  auto p = sp::parse_profile_string(kProfile, "m.json");
  REQUIRE(p.ok());
  sp::TableCostModel cost(two_islands());
  // Cluster figures first: 1 MB intra = 20 us + 1e6 / 5e9 s = 0.02 + 0.2 ms.
  CHECK(cost.p2p_ms(1e6, false) == Approx(0.22));
  cost.use_measured_links(*p->links);
  // Measured p2p: 1.5 us + 1e6 / 4e9 s = 0.0015 + 0.25 ms.
  CHECK(cost.p2p_ms(1e6, false) == Approx(0.2515));
  // Inter-island not measured: the cluster's 50 us + 1e6 / 1e9 s.
  CHECK(cost.p2p_ms(1e6, true) == Approx(1.05));
  // All-reduce over devices 0, 1 (one island), measured ring figures:
  // 2 * 1/2 * 1e6 / 2.5e9 s + 2 * 1 * 3 us = 0.4 + 0.006 ms.
  CHECK(cost.allreduce_ms(1e6, {0, 1}) == Approx(0.406));
  // Across islands: the cluster's inter link, 2 * 3/4 * 1 ms + 6 * 50 us.
  CHECK(cost.allreduce_ms(1e6, {0, 1, 2, 3}) == Approx(1.5 + 0.3));
}
