// Plan costing (libplan/planner/cost_plan.h) on a hand-built two-island plan,
// every figure computed by hand in the comments.
#include <catch2/catch.hpp>

#include "libplan/cost/cost_model.h"
#include "libplan/plan/check.h"
#include "libplan/planner/cost_plan.h"

namespace sp = spindle::plan;

namespace {

// One task, batch 8, fp32: a (patch_embed -> pool_project, seq 2),
// b (token_embed -> pool_project, seq 3), l = contrastive_loss(a, b).
const char* kModel = R"(
name: two-wave
dtype: fp32
modules:
  enc:
    - {op: patch_embed, in_dim: 4, hidden: 8}
    - {op: pool_project, in: 8, out: 4}
  tx:
    - {op: token_embed, vocab: 10, hidden: 8}
    - {op: pool_project, in: 8, out: 4}
  loss:
    - {op: contrastive_loss, dim: 4}
tasks:
  - name: t
    batch: 8
    nodes:
      - {id: a, module: enc, seq: 2}
      - {id: b, module: tx, seq: 3}
      - {id: l, module: loss, inputs: [a, b]}
)";

}  // namespace

TEST_CASE("cost_plan: transfers, gradient sync and memory by hand", "[cost_plan]") {
  auto model = sp::parse_model_string(kModel, "two-wave.yaml");
  REQUIRE(model.ok());
  const sp::OpGraph graph = sp::expand(*model);
  REQUIRE(graph.ops.size() == 5);  // a/0.0 a/1.0 b/0.0 b/1.0 l/0.0

  // 2 islands x 2 devices; intra 10 GB/s, 1 us; inter 1 GB/s, 10 us.
  sp::Cluster cluster;
  cluster.name = "2x2";
  cluster.islands = 2;
  cluster.devices_per_island = 2;
  cluster.memory_gib = 1;
  cluster.intra_island = {10, 1};
  cluster.inter_island = {1, 10};
  sp::TableCostModel cost(cluster);
  // Parameter bytes (fp32) from the catalogue: patch_embed 4*8+8+2*8 = 56
  // params; pool_project 8*4+4+2*8 = 52; token_embed 10*8+3*8 = 104; loss 0.
  // Activation bytes per sample chosen by hand: 100, 10, 50, 20, 5.
  const int64_t params[] = {56, 52, 104, 52, 0};
  const int64_t act[] = {100, 10, 50, 20, 5};
  for (int i = 0; i < 5; ++i) cost.set(graph.ops[i].workload, sp::ScalingCurve(), params[i] * 4, act[i]);

  sp::Plan plan;
  plan.devices = 4;
  plan.devices_per_island = 2;
  plan.memory_bytes = 1 << 30;
  plan.model_name = "two-wave";
  for (int i = 0; i < 5; ++i) {
    const sp::Operator& op = graph.ops[i];
    sp::PlanMetaOp m;
    m.id = i;
    m.task = "t";
    m.workload = op.workload;
    m.operators = {op.id};
    m.level = i == 4 ? 2 : (i % 2);
    if (i == 1) m.inputs = {0};
    if (i == 3) m.inputs = {2};
    if (i == 4) m.inputs = {1, 3};
    plan.metaops.push_back(m);
  }
  plan.waves = {
      {0, 0, 0, {{0, 0, 1, {0, 1}, 1.0}, {2, 0, 1, {2, 3}, 2.0}}},
      {1, 0, 0, {{1, 0, 1, {0, 1}, 0.5}, {3, 0, 1, {2}, 1.0}}},
      {2, 0, 0, {{4, 0, 1, {0, 1, 2, 3}, 0.25}}},
  };
  sp::cost_plan(plan, *model, graph, cost);

  CHECK(plan.waves[0].ms == Approx(2.0));
  CHECK(plan.waves[1].ms == Approx(1.0));
  CHECK(plan.waves[2].ms == Approx(0.25));
  // Wave 0 has no inputs.
  CHECK(plan.waves[0].transfer_ms == 0.0);
  // Wave 1: b/1.0 on [2] needs rows 4..8 of token_embed's output from device 3
  // (same island): 4 rows x 3 x 8 x 4 B = 384 B -> 1 us + 384 B / 10 GB/s
  // = 0.0010384 ms, twice (activations forward, gradients backward).
  CHECK(plan.waves[1].transfer_ms == Approx(2 * 0.0010384));
  // Wave 2: the loss on [0..3], 2 rows each, pooled 16 B per sample.
  // From a's pool on [0,1]: dev1 <- dev0 32 B intra; dev2, dev3 <- dev1 32 B
  // each across (64 B into island 1). From b's pool on [2]: dev0, dev1 <- dev2
  // across (64 B into island 0); dev3 <- dev2 32 B intra.
  // max(1 us + 32 B / 10 GB/s, 10 us + 64 B / 1 GB/s) = 0.010064 ms, twice.
  CHECK(plan.waves[2].transfer_ms == Approx(2 * 0.010064));

  // Gradient sync, ring all-reduce 2(p-1)/p B/bw + 2(p-1) lat, per device summed:
  // enc/0.0: 224 B on [0,1]: 224/10e9 s + 2 us = 0.0020224 ms
  // enc/1.0: 208 B on [0,1]: 0.0020208 ms;  tx/0.0: 416 B on [2,3]: 0.0020416 ms
  // tx/1.0 on [2] alone and the loss (no parameters): 0.
  // Device 0 and 1: 0.0040432 ms, the slowest.
  CHECK(plan.predicted.sync_ms == Approx(0.0040432));
  CHECK(plan.predicted.compute_ms == Approx(3.25));
  CHECK(plan.predicted.transfer_ms == Approx(2 * 0.0010384 + 2 * 0.010064));
  CHECK(plan.predicted.iteration_ms ==
        Approx(plan.predicted.compute_ms + plan.predicted.transfer_ms + plan.predicted.sync_ms));

  // Memory: per fp32 parameter 8 B (weights, gradients) on every device that
  // runs it, plus 8 B (AdamW m, v) sharded over the group's p devices; plus
  // activations kept for backward at the local batch.
  // dev0: (56 + 52) x (8 + 8/2) + 100*8/2 + 10*8/2 + 5*8/4 = 1296 + 450 = 1746
  // dev2: 104 x (8 + 8/2) + 52 x (8 + 8/1) + 50*8/2 + 20*8/1 + 5*8/4 = 2080 + 370 = 2450
  // dev3: 104 x (8 + 8/2) + 50*8/2 + 5*8/4 = 1248 + 210 = 1458
  REQUIRE(plan.predicted.memory_bytes.size() == 4);
  CHECK(plan.predicted.memory_bytes[0] == 1746);
  CHECK(plan.predicted.memory_bytes[1] == 1746);
  CHECK(plan.predicted.memory_bytes[2] == 2450);
  CHECK(plan.predicted.memory_bytes[3] == 1458);

  // Parameter groups are exactly the devices that ran each parameter.
  REQUIRE(plan.param_groups.size() == 5);
  CHECK(plan.param_groups[0].param == "enc/0.0");
  CHECK(plan.param_groups[0].devices == std::vector<int>{0, 1});
  CHECK(plan.param_groups[2].param == "loss/0.0");
  CHECK(plan.param_groups[2].devices == std::vector<int>{0, 1, 2, 3});
  CHECK(sp::check_plan(plan, *model, graph).empty());
}
