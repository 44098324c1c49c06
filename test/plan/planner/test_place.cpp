// Placement (libplan/place/place.h): islands, locality, shared parameters,
// memory and backtracking on hand-made waves; and on the shipped two-node
// workloads, island placement against the naive one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <set>

#include "../shipped_fixture.h"
#include "helpers.h"
#include "libplan/cost/cost_model.h"
#include "libplan/place/place.h"
#include "libplan/planner/planner.h"
#include "libplan/graph/contract.h"
#include "libplan/lower/lower.h"
#include "libplan/plan/plan_io.h"
#include "libplan/sim/sim.h"
#include "libplan/util/parallel.h"

using namespace spindle::plan;
using spindle::plan::test::test_cluster;

namespace {

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

// Bytes the slots of `placed` read from another island, as costing
// re-shards (tensor_parallel 1, rows split evenly): per wave, each slot's
// input is its MetaOp's previous slice.
double cross_island_bytes(const std::vector<AbstractWave>& waves, const std::vector<WavePlacement>& placed,
                          const PlaceInput& in) {
  std::map<int, std::vector<int>> last;
  double bytes = 0;
  for (size_t w = 0; w < waves.size(); ++w) {
    for (size_t s = 0; s < waves[w].slots.size(); ++s) {
      const AbstractSlot& slot = waves[w].slots[s];
      const auto it = last.find(slot.metaop);
      if (slot.first == 0 || it == last.end()) continue;
      const PlaceMetaOp& m = in.metaops[static_cast<size_t>(slot.metaop)];
      const std::vector<int>& src = it->second;
      const std::vector<int>& dst = placed[w].slot_devices[s];
      const int64_t b = m.batch;
      const auto ns = static_cast<int64_t>(src.size()), nd = static_cast<int64_t>(dst.size());
      for (int64_t j = 0; j < nd; ++j)
        for (int64_t g = 0; g < ns; ++g) {
          const int64_t rows = std::min(b * (j + 1) / nd, b * (g + 1) / ns) - std::max(b * j / nd, b * g / ns);
          if (rows > 0 && src[static_cast<size_t>(g)] / in.devices_per_island !=
                              dst[static_cast<size_t>(j)] / in.devices_per_island)
            bytes += static_cast<double>(rows) * m.out_bytes_per_sample;
        }
    }
    for (size_t s = 0; s < waves[w].slots.size(); ++s)
      last[waves[w].slots[s].metaop] = placed[w].slot_devices[s];
  }
  return bytes;
}

}  // namespace

TEST_CASE("place: a slot that fits an island is not split, the naive placement splits it", "[place]") {
  const Cluster c = test_cluster(2, 4);
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
  const Cluster c = test_cluster(2, 4);
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

TEST_CASE("place: the final improvement moves a light slice across rather than a heavy one", "[place]") {
  // Two islands of 4. Wave 0: MetaOp 0 (light output) on 2 devices, 3
  // (heavy output) on 2, 4 on 2, 1 and 2 on one each. Wave 1: 0 widens to 4
  // devices, 3 narrows to 1, 1 and 4 keep their devices. Greedily, 0 takes
  // the four devices of its island and 3 has to cross to the other one; the
  // improvement sends one device's rows of 0 across instead.
  const Cluster c = test_cluster(2, 4);
  TableCostModel cost(c);
  PlaceInput in = input(c, cost, 5);
  for (PlaceMetaOp& m : in.metaops) {
    m.param = {-1, -1};
    m.act_bytes_per_sample = {0, 0};
  }
  in.metaops[3].out_bytes_per_sample = 8e6;
  auto cont = [](int metaop, int devices) { return AbstractSlot{metaop, 1, 1, devices, 1.0}; };
  const std::vector<AbstractWave> waves{
      {{slot(0, 2), slot(1, 1), slot(2, 1), slot(3, 2), slot(4, 2)}, 1.0},
      {{cont(0, 4), cont(1, 1), cont(3, 1), cont(4, 2)}, 1.0}};
  const auto placed = place_islands(waves, in);
  for (const WavePlacement& w : placed) {
    std::set<int> used;
    for (const auto& devs : w.slot_devices)
      for (int d : devs) CHECK(used.insert(d).second);
  }
  // MetaOp 3 stays in the island holding its rows; 0 spans both islands.
  CHECK(islands_of(placed[1].slot_devices[2], 4) == islands_of(placed[0].slot_devices[3], 4));
  CHECK(islands_of(placed[1].slot_devices[0], 4).size() == 2);
  // Rows crossing: a few of 0's (1 MB a sample) or 4's, not all of 3's (8
  // samples of 8 MB), as greedily.
  CHECK(cross_island_bytes(waves, placed, in) < 8e6);
}

TEST_CASE("place: a MetaOp joins the island already holding its parameters", "[place]") {
  const Cluster c = test_cluster(2, 4);
  TableCostModel cost(c);
  PlaceInput in = input(c, cost, 5);
  // Parameter 0 (4 MB) is used by MetaOps 1 and 2 (two tasks sharing a
  // layer); 0, 3 and 4 have none. No activations move.
  in.param_bytes = {4e6};
  in.param_sync_bytes = in.param_bytes;
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

TEST_CASE("place: memory per device is never exceeded, earlier waves are placed again", "[place][memory]") {
  // One island of 2 devices, fp32: a parameter costs 8 bytes (weights and
  // gradients) + 8 / replicas (AdamW m, v) per element on each device.
  const Cluster c = test_cluster(1, 2);
  TableCostModel cost(c);
  PlaceInput in = input(c, cost, 4);
  in.metaops[2].inputs = {0};   // MetaOp 2 prefers the device holding 0's output
  // Elements: 1000, 100, 500, 600 -> bytes 4x that in the dtype.
  in.param_bytes = {4000, 400, 2000, 2400};
  in.param_sync_bytes = in.param_bytes;
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
    // Placement alone: the boundary shifts after it keep whatever simulates
    // faster, which on ofasys-7 moves a little more (49.6 against 49.3
    // device-ms with the cyclic shift scan).
    req.shift_simulations = 0;
    auto islands = make_plan(req);
    req.placement = Placement::sequential;
    auto naive = make_plan(req);
    REQUIRE(islands.ok());
    REQUIRE(naive.ok());
    // Compared on the simulated timeline (the planner's objective): the
    // iteration, and the device time spent moving activations.
    auto sim_islands = simulate_plan(*islands, f.model, f.graph, *f.cost);
    auto sim_naive = simulate_plan(*naive, f.model, f.graph, *f.cost);
    REQUIRE(sim_islands.ok());
    REQUIRE(sim_naive.ok());
    CHECK(islands->predicted.simulated_ms == Approx(sim_islands->iteration_ms));
    CHECK(islands->predicted.simulated_ms < naive->predicted.simulated_ms);
    CHECK(sim_islands->transfer_device_ms() < sim_naive->transfer_device_ms());
    // The target (docs/workloads.md, "Numbers to reach"): inter-wave
    // transfers at most 4% of the devices' time.
    const double device_ms = sim_islands->iteration_ms * static_cast<double>(islands->devices);
    CHECK(sim_islands->transfer_device_ms() <= 0.04 * device_ms);
    // Slices that fit an island mostly keep to one: greedily, all of them
    // except where the wave leaves no island with room; the final
    // improvement spreads a few more over both when that shortens the
    // predicted transfers and gradient synchronisation.
    int split = 0, small = 0;
    for (const Wave& w : islands->waves)
      for (const Slice& s : w.slices)
        if (s.devices.size() <= 8) {
          ++small;
          split += islands_of(s.devices, 8).size() > 1;
        }
    // Fewer than a quarter of the slices. With the gradient all-reduces
    // behind the backward pass (overlap), spreading a slice over both
    // islands costs less sync time than with blocking all-reduces, and the
    // improver does it more often (ofasys-7: 16 of 74 slices; 6 of 73
    // planned with --no-overlap).
    CHECK(split * 4 < small);
  }
}

namespace {

// The plan's waves as the scheduler's abstract waves and their placement.
void abstract_of(const Plan& plan, std::vector<AbstractWave>& waves, std::vector<WavePlacement>& placed) {
  waves.clear();
  placed.clear();
  for (const Wave& w : plan.waves) {
    AbstractWave a;
    WavePlacement p;
    for (const Slice& s : w.slices) {
      a.slots.push_back({s.metaop, s.first, s.count, static_cast<int>(s.devices.size()), s.ms});
      p.slot_devices.push_back(s.devices);
      std::sort(p.slot_devices.back().begin(), p.slot_devices.back().end());
    }
    waves.push_back(std::move(a));
    placed.push_back(std::move(p));
  }
}

// What the lowered programs move: per wave and direction, bytes delivered to
// each device from its island and to each island from the others; per
// device, the bytes it all-reduces.
PlacementBytes lowered_bytes(const Lowered& l, int waves, int per_island) {
  const int islands = (l.devices + per_island - 1) / per_island;
  PlacementBytes out;
  const PlacementBytes::Exchange empty{std::vector<double>(static_cast<size_t>(l.devices), 0.0),
                                       std::vector<double>(static_cast<size_t>(islands), 0.0)};
  out.forward.assign(static_cast<size_t>(waves), empty);
  out.backward.assign(static_cast<size_t>(waves), empty);
  for (const Transfer& t : l.transfers) {
    // The copies at the step's end (Direction::copy) are in no wave's
    // exchange, and the evaluator leaves them out: a few vectors per layer.
    if (t.src == t.dst || t.dir == Direction::copy) continue;
    auto& ex = (t.dir == Direction::forward ? out.forward : out.backward)[static_cast<size_t>(t.wave)];
    if (t.src / per_island == t.dst / per_island)
      ex.intra[static_cast<size_t>(t.dst)] += static_cast<double>(t.bytes);
    else
      ex.inter[static_cast<size_t>(t.dst / per_island)] += static_cast<double>(t.bytes);
  }
  for (int d = 0; d < l.devices; ++d) out.reduced.push_back(static_cast<double>(l.bytes(d).reduced));
  return out;
}

void check_same_bytes(const PlacementBytes& evaluator, const PlacementBytes& lowered) {
  REQUIRE(evaluator.forward.size() == lowered.forward.size());
  for (size_t w = 0; w < lowered.forward.size(); ++w) {
    INFO("wave " << w);
    CHECK(evaluator.forward[w].intra == lowered.forward[w].intra);
    CHECK(evaluator.forward[w].inter == lowered.forward[w].inter);
    CHECK(evaluator.backward[w].intra == lowered.backward[w].intra);
    CHECK(evaluator.backward[w].inter == lowered.backward[w].inter);
  }
  CHECK(evaluator.reduced == lowered.reduced);
}

}  // namespace

TEST_CASE("place: the improvement counts the bytes the lowered programs move, on shipped and random placements",
          "[place][shipped][lower]") {
  struct Case {
    const char* model;
    const char* cluster;
  };
  // Every shipped model with a profile on two nodes (and tiny-lm, tensor
  // parallel 2, on one): plans with producers and consumers of differing
  // tensor parallelism, re-sharding within and across islands.
  for (const Case c : {Case{"multitask-clip-4", "a800-2x8"}, Case{"multitask-clip-10", "a800-4x8"},
                       Case{"ofasys-7", "a800-2x8"}, Case{"qwen-val-3", "a800-4x8"}, Case{"tiny-clip", "a800-2x8"},
                       Case{"tiny-lm", "a800-1x8"}, Case{"tiny-lm", "cpu-1x4"}}) {
    INFO(c.model << " on " << c.cluster);
    spindle::plan::testing::Fixture f(c.model, c.cluster);
    PlanRequest req{&f.model, &f.graph, &f.cluster, f.cost.get(), "", Strategy::spindle};
    // Replicated: the evaluator counts each bucket's all-reduce bytes,
    // which a sharded plan's reduce-scatter pads to equal chunks (auto may
    // shard a plan that simulates faster so).
    req.choose_optimizer_state = false;
    req.optimizer_state = OptimizerState::replicated;
    const PlaceInput in = placement_input(contract(f.graph), req);
    std::mt19937 rng(12345);
    for (Strategy s : {Strategy::spindle, Strategy::sequential, Strategy::intra_task}) {
      req.strategy = s;
      auto plan = make_plan(req);
      REQUIRE(plan.ok());
      for (int trial = 0; trial < 4; ++trial) {
        INFO(strategy_name(s) << ", trial " << trial << (trial == 0 ? " (as planned)" : " (devices permuted)"));
        if (trial > 0) {
          // A random placement of the same waves: every device id renamed by
          // one permutation (the plan stays valid).
          std::vector<int> perm(static_cast<size_t>(plan->devices));
          std::iota(perm.begin(), perm.end(), 0);
          std::shuffle(perm.begin(), perm.end(), rng);
          for (Wave& w : plan->waves)
            for (Slice& sl : w.slices)
              for (int& d : sl.devices) d = perm[static_cast<size_t>(d)];
        }
        std::vector<AbstractWave> waves;
        std::vector<WavePlacement> placed;
        abstract_of(*plan, waves, placed);
        auto lowered = lower(*plan, f.model, f.graph);
        REQUIRE(lowered.ok());
        check_same_bytes(placement_bytes(waves, in, placed),
                         lowered_bytes(*lowered, static_cast<int>(plan->waves.size()), f.cluster.devices_per_island));
      }
    }
  }
}

TEST_CASE("make_plan: the same plan on 1, 2 and 3 threads (SPINDLE_PLAN_THREADS)", "[planner][shipped]") {
  // Candidates and scheduler variants run on parallel threads; each thread
  // bounds its simulations by what it has seen, so the plan must not depend
  // on how many there are or which ran what.
  const char* before = std::getenv("SPINDLE_PLAN_THREADS");
  const std::string saved = before ? before : "";
  for (const char* model : {"multitask-clip-10", "ofasys-7", "qwen-val-3"}) {
    INFO(model);
    spindle::plan::testing::Fixture f(model, "a800-2x8");
    PlanRequest req{&f.model, &f.graph, &f.cluster, f.cost.get(), "", Strategy::spindle};
    // A few boundary shifts: test_shift's "the same on any threads" runs
    // the default budget.
    req.shift_simulations = 8;
    std::vector<std::string> plans;
    for (const char* threads : {"1", "2", "3"}) {
      setenv("SPINDLE_PLAN_THREADS", threads, 1);
      CHECK(parallel_workers(100) == static_cast<size_t>(std::stoi(threads)));
      auto plan = make_plan(req);
      REQUIRE(plan.ok());
      plan->planning_ms = 0;
      plans.push_back(plan_to_json(*plan));
    }
    CHECK(plans[0] == plans[1]);
    CHECK(plans[0] == plans[2]);
  }
  setenv("SPINDLE_PLAN_THREADS", "0", 1);   // out of range: ignored
  CHECK(parallel_workers(1000) == std::min<size_t>(1000, std::max(1u, std::thread::hardware_concurrency())));
  if (before) setenv("SPINDLE_PLAN_THREADS", saved.c_str(), 1);
  else unsetenv("SPINDLE_PLAN_THREADS");
}
