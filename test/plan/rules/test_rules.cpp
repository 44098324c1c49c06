// The rules layer (libplan/rules): valid device counts, row layouts and the
// re-shard moves, memory and link formulas, each against values computed by
// hand.
#include <catch2/catch.hpp>

#include <algorithm>
#include <tuple>
#include <vector>

#include "libplan/rules/devices.h"
#include "libplan/rules/links.h"
#include "libplan/rules/memory.h"
#include "libplan/rules/rows.h"

using namespace spindle::plan;

TEST_CASE("valid device counts: a multiple of K whose data-parallel size divides the batch") {
  // K = 1: the divisors of the batch.
  CHECK(valid_device_counts(8, 1, 12) == std::vector<int>{1, 2, 3, 4, 6});
  // K = 4, batch 32 on 64 devices: n / 4 in {1, 2, 4, 8, 16} -> n up to 64
  // (16 groups of 2 rows), which "n divides the batch" would forbid.
  CHECK(valid_device_counts(64, 4, 32) == std::vector<int>{4, 8, 16, 32, 64});
  CHECK(valid_device_count(64, 4, 32));
  CHECK_FALSE(valid_device_count(48, 4, 32));   // 12 groups do not split 32 rows
  CHECK_FALSE(valid_device_count(6, 4, 32));    // not a multiple of K
  CHECK(valid_device_counts(3, 4, 32).empty());
  CHECK_FALSE(valid_device_count(0, 1, 8));
  CHECK_FALSE(valid_device_count(2, 0, 8));
  CHECK_FALSE(valid_device_count(2, 1, 0));
}

TEST_CASE("several valid device counts: the same answer as listing them") {
  // By hand: batch 7 (prime) on K = 2 has counts 2 and 14: two need 14 devices.
  CHECK_FALSE(several_valid_device_counts(13, 2, 7));
  CHECK(several_valid_device_counts(14, 2, 7));
  CHECK_FALSE(several_valid_device_counts(64, 4, 1));   // batch 1: n = K only
  CHECK_FALSE(several_valid_device_counts(4, 0, 8));
  int several = 0;
  for (int devices = 1; devices <= 40; ++devices)
    for (int tp = 1; tp <= 8; ++tp)
      for (int64_t batch = 1; batch <= 60; ++batch) {
        const bool listed = valid_device_counts(devices, tp, batch).size() >= 2;
        several += listed ? 1 : 0;
        REQUIRE(several_valid_device_counts(devices, tp, batch) == listed);
      }
  CHECK(several > 1000);   // both answers were exercised
}

TEST_CASE("row layouts: groups of K devices hold the same rows") {
  const RowLayout two{12, 2, 1}, three{12, 3, 1}, tp{12, 4, 2};
  CHECK(two.rows_of(1) == RowRange{6, 12});
  CHECK(three.rows_of(1) == RowRange{4, 8});
  CHECK(tp.rows_of(1) == RowRange{0, 6});  // positions 0, 1: group 0
  CHECK(tp.rows_of(2) == RowRange{6, 12});
  CHECK(tp.tp_rank_of(3) == 1);
  CHECK(intersect({0, 4}, {4, 8}).size() == 0);
  CHECK(intersect({0, 6}, {4, 8}) == RowRange{4, 6});
}

TEST_CASE("re-shard moves by hand: each receiver gets its rows from the nearest replica") {
  const std::vector<int> a{0, 1}, b{2, 3, 4}, same{0, 1, 2};
  // 2 -> 3 devices (one island of 8): each consumer gets exactly its rows.
  CHECK(reshard_moves(a, 1, b, 1, 12, 8) ==
        std::vector<RowMove>{{0, 2, {0, 4}}, {0, 3, {4, 6}}, {1, 3, {6, 8}}, {1, 4, {8, 12}}});
  // Gradients back, 3 -> 2.
  CHECK(reshard_moves(b, 1, a, 1, 12, 8) ==
        std::vector<RowMove>{{2, 0, {0, 4}}, {3, 0, {4, 6}}, {3, 1, {6, 8}}, {4, 1, {8, 12}}});
  // Same devices, same layout: every move is local.
  CHECK(reshard_moves(same, 1, same, 1, 12, 8) ==
        std::vector<RowMove>{{0, 0, {0, 4}}, {1, 1, {4, 8}}, {2, 2, {8, 12}}});

  // A TP-2 producer on devices 0-3 (groups {0,1}, {2,3}), consumer on 1, 4, 5
  // with islands of 4: device 1 holds a replica of group 0 itself; device 4
  // and 5 are on the other island, so they take TP rank 0 (devices 0 and 2).
  const std::vector<int> tp{0, 1, 2, 3}, c{1, 4, 5};
  CHECK(reshard_moves(tp, 2, c, 1, 12, 4) ==
        std::vector<RowMove>{{1, 1, {0, 4}}, {0, 4, {4, 6}}, {2, 4, {6, 8}}, {2, 5, {8, 12}}});
  // The same consumer inside the producer's island (islands of 8): device 1
  // still keeps its own rows; 4 and 5 take TP rank 0 (first on the island).
  CHECK(reshard_moves(tp, 2, c, 1, 12, 8) ==
        std::vector<RowMove>{{1, 1, {0, 4}}, {0, 4, {4, 6}}, {2, 4, {6, 8}}, {2, 5, {8, 12}}});
  // Replica on the receiver's island but not TP rank 0: producer groups
  // {3, 4} and {5, 6} over islands of 4 ({0-3}, {4-7}); receiver 1 takes
  // group 0's rows from device 3 (its island), receiver 7 group 1's from 5.
  const std::vector<int> split{3, 4, 5, 6}, r{1, 7};
  CHECK(reshard_moves(split, 2, r, 1, 4, 4) == std::vector<RowMove>{{3, 1, {0, 2}}, {5, 7, {2, 4}}});

  // Every replica of a TP consumer group receives its rows (gradients of a
  // TP producer: each TP rank needs them).
  CHECK(reshard_moves(b, 1, tp, 2, 12, 8) ==
        std::vector<RowMove>{{2, 0, {0, 4}}, {3, 0, {4, 6}}, {2, 1, {0, 4}}, {3, 1, {4, 6}},
                             {3, 2, {6, 8}}, {4, 2, {8, 12}}, {3, 3, {6, 8}}, {4, 3, {8, 12}}});
}

TEST_CASE("re-shard moves both ways: the two walks' moves, as multisets") {
  // Both ways at once gives the moves of reshard_moves(from, to) and of
  // reshard_moves(to, from), whatever the layouts (with one holder per row
  // on both sides, the backward ones come in another order).
  auto sorted = [](std::vector<RowMove> v) {
    std::sort(v.begin(), v.end(), [](const RowMove& a, const RowMove& b) {
      return std::tie(a.src, a.dst, a.rows.begin, a.rows.end) < std::tie(b.src, b.dst, b.rows.begin, b.rows.end);
    });
    return v;
  };
  struct Case {
    std::vector<int> from;
    int from_tp;
    std::vector<int> to;
    int to_tp;
    int64_t batch;
    int per_island;
  };
  for (const Case& c : {Case{{0, 1}, 1, {2, 3, 4}, 1, 12, 8}, Case{{0, 1, 2, 3}, 1, {5, 9}, 1, 24, 4},
                        Case{{0, 1, 2, 3}, 2, {1, 4, 5}, 1, 12, 4}, Case{{2, 3, 4}, 1, {0, 1, 2, 3}, 2, 12, 8},
                        Case{{0, 1, 2}, 1, {0, 1, 2}, 1, 6, 2}}) {
    std::vector<RowMove> fwd, bwd;
    for_each_reshard_move_both_ways(
        c.from, c.from_tp, c.to, c.to_tp, c.batch, c.per_island, [&](const RowMove& m) { fwd.push_back(m); },
        [&](const RowMove& m) { bwd.push_back(m); });
    CHECK(fwd == reshard_moves(c.from, c.from_tp, c.to, c.to_tp, c.batch, c.per_island));
    CHECK(sorted(bwd) == sorted(reshard_moves(c.to, c.to_tp, c.from, c.from_tp, c.batch, c.per_island)));
  }
}

TEST_CASE("memory: parameter state and activations per device, by hand") {
  // 1000 bytes of bf16 (500 values): weights + grads 2 x 2 bytes, fp32 master
  // + m + v 12 bytes sharded over 4 replicas -> 500 * (4 + 3) = 3500.
  CHECK(param_state_bytes(1000, 2, 4, OptimizerState::sharded) == Approx(3500));
  // Replicated (what spindle-run holds): the whole 12 bytes on each replica,
  // 500 * (4 + 12) = 8000.
  CHECK(param_state_bytes(1000, 2, 4, OptimizerState::replicated) == Approx(8000));
  // fp32: no master copy, m + v = 8 bytes over 1 replica: 250 * (8 + 8),
  // the same either way; over 2 replicas, 250 * (8 + 4) sharded.
  CHECK(param_state_bytes(1000, 4, 1, OptimizerState::sharded) == Approx(4000));
  CHECK(param_state_bytes(1000, 4, 1, OptimizerState::replicated) == Approx(4000));
  CHECK(param_state_bytes(1000, 4, 2, OptimizerState::sharded) == Approx(3000));
  CHECK(param_state_bytes(1000, 4, 2, OptimizerState::replicated) == Approx(4000));
  CHECK(optimizer_state_named("sharded") == OptimizerState::sharded);
  CHECK(optimizer_state_named("replicated") == OptimizerState::replicated);
  CHECK_FALSE(optimizer_state_named("Sharded").has_value());
  CHECK_FALSE(optimizer_state_named("").has_value());
  CHECK(std::string(optimizer_state_name(OptimizerState::replicated)) == "replicated");
  CHECK(param_replicas(8, 2) == 4.0);
  CHECK(param_replicas(1, 2) == 1.0);
  CHECK(activation_bytes(100, 32, 8) == Approx(400));
  // As spindle-run holds it: 4 devices in TP groups of 2 hold 8 x 2 / 4 = 4
  // rows each, 100 bytes whole and 40 over the group's 2 ranks per row:
  // 4 x (100 + 20). Without TP 2 rows of 140; the whole batch: 8 rows.
  CHECK(run_activation_bytes(100, 40, 8, 4, 2, false) == Approx(480));
  CHECK(run_activation_bytes(100, 40, 8, 4, 1, false) == Approx(280));
  CHECK(run_activation_bytes(100, 40, 8, 4, 2, true) == Approx(960));
}

TEST_CASE("links: latency plus bytes over bandwidth, ring all-reduce and all-gather over the slowest link") {
  const Link intra{200, 5}, inter{25, 10};
  CHECK(link_ms(intra, 0) == Approx(0.005));
  CHECK(link_ms(intra, 200e6) == Approx(1.005));
  // 8 devices on one island: 2 * 7/8 * 1e9 / 200e9 s = 8.75 ms, + 14 * 5 us.
  CHECK(ring_allreduce_ms(intra, inter, 8, 1e9, {0, 1, 2, 3, 4, 5, 6, 7}) == Approx(8.75 + 0.070));
  // Across islands: 2 * 1/2 * 1e9 / 25e9 s = 40 ms, + 2 * 10 us.
  CHECK(ring_allreduce_ms(intra, inter, 8, 1e9, {7, 8}) == Approx(40.020));
  CHECK(ring_allreduce_ms(intra, inter, 8, 1e9, {3}) == 0.0);
  // The bytes each member moves: 2 (p-1)/p of the buffer, none alone.
  CHECK(ring_allreduce_bytes(1e9, 8) == Approx(1.75e9));
  CHECK(ring_allreduce_bytes(100, 2) == Approx(100));
  CHECK(ring_allreduce_bytes(100, 1) == 0.0);
  // All-gather of 1e9 bytes in all: half the all-reduce's steps. 4 devices
  // on one island: 3/4 * 1e9 / 200e9 s = 3.75 ms, + 3 * 5 us.
  CHECK(ring_allgather_ms(intra, inter, 8, 1e9, first_devices(4)) == Approx(3.75 + 0.015));
  // Devices 0..9 span two islands: 9/10 * 1e9 / 25e9 s = 36 ms, + 9 * 10 us.
  CHECK(ring_allgather_ms(intra, inter, 8, 1e9, first_devices(10)) == Approx(36.090));
  CHECK(ring_allgather_ms(intra, inter, 8, 1e9, first_devices(1)) == 0.0);
  CHECK(first_devices(3) == std::vector<int>{0, 1, 2});
  // Islands: runs of consecutive ids; a figure below 1 counts as 1.
  CHECK(island_of(7, 8) == 0);
  CHECK(island_of(8, 8) == 1);
  CHECK(island_of(5, 0) == 5);
  CHECK(island_count(20, 8) == 3);
  CHECK(island_count(16, 8) == 2);
  CHECK(island_count(3, -1) == 3);
  CHECK(first_devices(0).empty());
}
