// Cluster descriptions (spec/cluster.md).
#include <catch2/catch.hpp>

#include <string>

#include "libplan/model/cluster.h"

using namespace spindle::plan;

namespace {

Cluster load_shipped_cluster(const std::string& name) {
  const std::string path = std::string(SPINDLE_SOURCE_DIR) + "/configs/clusters/" + name + ".yaml";
  Result<Cluster> c = load_cluster(path);
  INFO(path << ": " << (c.ok() ? std::string("ok") : c.error().message));
  REQUIRE(c.ok());
  return std::move(c).value();
}

}  // namespace

TEST_CASE("shipped A800 clusters parse", "[cluster]") {
  for (int n : {1, 2, 4, 8}) {
    const Cluster c = load_shipped_cluster("a800-" + std::to_string(n) + "x8");
    CHECK(c.name == "a800-" + std::to_string(n) + "x8");
    CHECK(c.islands == n);
    CHECK(c.devices_per_island == 8);
    CHECK(c.devices() == 8 * n);
    CHECK(c.device_name == "A800-SXM4-80GB");
    CHECK(c.memory_bytes() == 85899345920LL);  // 80 * 2^30, spec/plan.md example
    CHECK(c.peak_tflops == 312);
    CHECK(c.memory_gbytes_per_s == 2039);
    CHECK(c.intra_island.gbytes_per_s == 200);
    CHECK(c.intra_island.latency_us == 3);
    CHECK(c.inter_island.gbytes_per_s == 50);
    CHECK(c.inter_island.latency_us == 8);
    CHECK(c.sha256.size() == 64);
  }
  const Cluster big = load_shipped_cluster("a800-8x8");
  CHECK(big.island_of(0) == 0);
  CHECK(big.island_of(7) == 0);
  CHECK(big.island_of(8) == 1);
  CHECK(big.island_of(63) == 7);
}

TEST_CASE("shipped H200 cluster parses", "[cluster]") {
  const Cluster c = load_shipped_cluster("h200-1x8");
  CHECK(c.devices() == 8);
  CHECK(c.memory_bytes() == 139LL * 1073741824LL);
  CHECK(c.peak_tflops == 989);
  CHECK(c.intra_island.gbytes_per_s == 450);
}

TEST_CASE("link_ms is latency plus bytes over bandwidth, in ms", "[cluster]") {
  const Link l{200, 3};
  CHECK(link_ms(l, 0) == Approx(0.003));
  // 200 MB at 200 GB/s = 1 ms, plus 3 us.
  CHECK(link_ms(l, 200e6) == Approx(1.003));
  CHECK(link_ms(Link{50, 8}, 1e9) == Approx(20.008));
}

TEST_CASE("memory_gbytes_per_s is optional, extension keys are free, fractions round down",
          "[cluster]") {
  Result<Cluster> c = parse_cluster_string(R"(
name: small
x-note: tested on a laptop
islands: 1
devices_per_island: 4
device: {name: cpu, memory_gib: 0.5000000001, peak_tflops: 0.1}
links:
  intra_island: {gbytes_per_s: 10, latency_us: 0}
  inter_island: {gbytes_per_s: 1, latency_us: 50}
)",
                                           "small.yaml");
  INFO((c.ok() ? std::string("ok") : c.error().message));
  REQUIRE(c.ok());
  CHECK(c->memory_gbytes_per_s == 0);
  CHECK(c->memory_bytes() == 536870912);
  CHECK(c->intra_island.latency_us == 0);
  CHECK(c->path == "small.yaml");

  Result<Cluster> bad = parse_cluster_string("name: [unclosed\n", "broken.yaml");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("broken.yaml:") == 0);
  CHECK(bad.error().message.find("malformed YAML") != std::string::npos);
}
