// Placement (libplan/place/place.h): islands, locality, shared parameters,
// memory and backtracking on hand-made waves; and on the shipped two-node
// workloads, island placement against the naive one.
#include <catch2/catch.hpp>

#include <set>

#include "../shipped_fixture.h"
#include "libplan/cost/cost_model.h"
#include "libplan/place/place.h"
#include "libplan/plan/planner.h"

using namespace spindle::plan;

namespace {

// `islands` x `per_island` devices; intra 200 GB/s, inter 50 GB/s.
Cluster cluster(int islands, int per_island) {
  Cluster c;
  c.name = "test";
  c.islands = islands;
  c.devices_per_island = per_island;
  c.memory_gib = 80;
  c.peak_tflops = 312;
  c.intra_island = {200, 3};
  c.inter_island = {50, 8};
  return c;
}

// `n` MetaOps without inputs, batch 8, one operator each, 1 MB of output
// activation per sample, no parameters, fp32.
PlaceInput input(const Cluster& c, const CostModel& cost, int n) {
  PlaceInput in;
  in.dtype_bytes = 4;
  in.devices = c.devices();
  in.devices_per_island = c.devices_per_island;
  in.cost = &cost;
  for (int m = 0; m < n; ++m) {
    PlaceMetaOp pm;
    pm.batch = 8;
    pm.out_bytes_per_sample = 1e6;
    pm.param = {-1};
    pm.act_bytes_per_sample = {0};
    in.metaops.push_back(pm);
  }
  return in;
}

AbstractSlot slot(int metaop, int devices) { return {metaop, 0, 1, devices, 1.0}; }

std::set<int> islands_of(const std::vector<int>& devices, int per_island) {
  std::set<int> out;
  for (int d : devices) out.insert(d / per_island);
  return out;
}

}  // namespace

TEST_CASE("place: a slot that fits an island is not split; the naive placement splits it", "[place]") {
  const Cluster c = cluster(2, 4);
  TableCostModel cost(c);
  const PlaceInput in = input(c, cost, 3);
  const std::vector<AbstractWave> waves{{{slot(0, 2), slot(1, 4), slot(2, 2)}, 1.0}};

  const auto naive = place_sequential(waves, 8);
  CHECK(naive[0].slot_devices[1] == std::vector<int>{2, 3, 4, 5});   // over both islands

  const auto placed = place_islands(waves, in);
  // Largest first: MetaOp 1 takes island 0, the two pairs share island 1.
  CHECK(placed[0].slot_devices[1] == std::vector<int>{0, 1, 2, 3});
  CHECK(placed[0].slot_devices[0] == std::vector<int>{4, 5});
  CHECK(placed[0].slot_devices[2] == std::vector<int>{6, 7});
}

TEST_CASE("place: a MetaOp goes to the island holding its inputs", "[place]") {
  const Cluster c = cluster(2, 4);
  TableCostModel cost(c);
  PlaceInput in = input(c, cost, 4);
  in.metaops[2].inputs = {1};
  in.metaops[3].inputs = {0};
  // Wave 0: MetaOp 0 on island 0, MetaOp 1 on island 1. Wave 1: 2 reads 1
  // and 3 reads 0, each on two devices.
  const std::vector<AbstractWave> waves{{{slot(0, 4), slot(1, 4)}, 1.0}, {{slot(2, 2), slot(3, 2)}, 1.0}};
  const auto placed = place_islands(waves, in);
  CHECK(placed[0].slot_devices[0] == std::vector<int>{0, 1, 2, 3});
  CHECK(placed[0].slot_devices[1] == std::vector<int>{4, 5, 6, 7});
  CHECK(islands_of(placed[1].slot_devices[0], 4) == std::set<int>{1});
  CHECK(islands_of(placed[1].slot_devices[1], 4) == std::set<int>{0});
  // The naive placement sends both across.
  const auto naive = place_sequential(waves, 8);
  CHECK(naive[1].slot_devices[0] == std::vector<int>{0, 1});
}

TEST_CASE("place: a MetaOp joins the island already holding its parameters", "[place]") {
  const Cluster c = cluster(2, 4);
  TableCostModel cost(c);
  PlaceInput in = input(c, cost, 5);
  // Parameter 0 (4 MB) is used by MetaOps 1 and 2 (two tasks sharing a
  // layer); 0, 3 and 4 have none. No activations move.
  in.param_bytes = {4e6};
  in.metaops[1].param = {0};
  in.metaops[2].param = {0};
  for (auto& m : in.metaops) m.out_bytes_per_sample = 0;
  // Wave 0: MetaOp 0 (4 devices) takes island 0, MetaOp 1 island 1.
  // Wave 1: three pairs; by size and id MetaOp 2 goes first, and island 1 is
  // the one where its parameter's all-reduce stays on the fast links.
  const std::vector<AbstractWave> waves{{{slot(0, 4), slot(1, 2)}, 1.0},
                                        {{slot(2, 2), slot(3, 2), slot(4, 2)}, 1.0}};
  const auto placed = place_islands(waves, in);
  CHECK(islands_of(placed[0].slot_devices[1], 4) == std::set<int>{1});
  CHECK(islands_of(placed[1].slot_devices[0], 4) == std::set<int>{1});

  // Without the shared parameter the lowest island wins the tie.
  in.metaops[2].param = {-1};
  const auto unshared = place_islands(waves, in);
  CHECK(islands_of(unshared[1].slot_devices[0], 4) == std::set<int>{0});
}

TEST_CASE("place: memory per device is never exceeded; earlier waves are placed again", "[place][memory]") {
  // One island of 2 devices, fp32: a parameter costs 8 bytes (weights and
  // gradients) + 8 / replicas (AdamW m, v) per element on each device.
  const Cluster c = cluster(1, 2);
  TableCostModel cost(c);
  PlaceInput in = input(c, cost, 4);
  in.metaops[2].inputs = {0};   // MetaOp 2 prefers the device holding 0's output
  // Elements: 1000, 100, 500, 600 -> bytes 4x that in the dtype.
  in.param_bytes = {4000, 400, 2000, 2400};
  for (int m = 0; m < 4; ++m) in.metaops[static_cast<size_t>(m)].param = {m};
  const std::vector<AbstractWave> waves{{{slot(0, 1), slot(1, 1)}, 1.0},
                                        {{slot(2, 1)}, 1.0},
                                        {{slot(3, 2)}, 1.0}};
  // Per device: MetaOp 0 16000 B, 1 1600 B, 2 8000 B (one device each:
  // 16 B per element); 3 on two devices 600 x (8 + 4) = 7200 B each.
  SECTION("unlimited memory: MetaOp 2 follows its input to device 0") {
    const auto placed = place_islands(waves, in);
    CHECK(placed[0].slot_devices[0] == std::vector<int>{0});
    CHECK(placed[1].slot_devices[0] == std::vector<int>{0});   // 16000 + 8000 + 7200 = 31200 B
  }
  SECTION("25600 B per device: wave 2 does not fit after the greedy wave 1, so wave 1 is placed again") {
    in.memory_bytes = 25600;
    const auto placed = place_islands(waves, in);
    // Device 0 would need 31200 B; with MetaOp 2 on device 1: 23200 and 16800.
    CHECK(placed[0].slot_devices[0] == std::vector<int>{0});
    CHECK(placed[1].slot_devices[0] == std::vector<int>{1});
    CHECK(placed[2].slot_devices[0] == std::vector<int>{0, 1});
  }
  SECTION("20000 B per device: MetaOp 2 cannot join device 0 at all") {
    in.memory_bytes = 20000;
    const auto placed = place_islands(waves, in);
    CHECK(placed[1].slot_devices[0] == std::vector<int>{1});
  }
  SECTION("the bytes charged per device, by hand") {
    CHECK(slot_bytes_per_device(in, slot(0, 1), [](int) { return false; }) == Approx(16000));
    CHECK(slot_bytes_per_device(in, slot(3, 2), [](int) { return false; }) == Approx(7200));
    CHECK(slot_bytes_per_device(in, slot(3, 2), [](int p) { return p == 3; }) == Approx(0));
  }
}

TEST_CASE("place: on two nodes, island placement moves less than the naive one", "[place][shipped]") {
  for (const char* model : {"multitask-clip-10", "ofasys-7"}) {
    INFO(model);
    spindle::plan::testing::Fixture f(model, "a800-2x8");
    PlanRequest req{&f.model, &f.graph, &f.cluster, f.cost.get(), "", Strategy::spindle};
    auto islands = make_plan(req);
    req.placement = Placement::sequential;
    auto naive = make_plan(req);
    REQUIRE(islands.ok());
    REQUIRE(naive.ok());
    CHECK(islands->predicted.transfer_ms < naive->predicted.transfer_ms);
    CHECK(islands->predicted.iteration_ms < naive->predicted.iteration_ms);
    // No slice that fits an island is spread over both when it could have
    // kept to one: here every slice of at most 8 devices stays in one island
    // except where the wave leaves no island with room.
    int split = 0, small = 0;
    for (const Wave& w : islands->waves)
      for (const Slice& s : w.slices)
        if (s.devices.size() <= 8) {
          ++small;
          split += islands_of(s.devices, 8).size() > 1;
        }
    CHECK(split * 10 < small);   // fewer than 10% of the slices
  }
}
