// Ring all-reduce, links, and the two CostModel implementations.
#include <catch2/catch.hpp>

#include "libplan/cost/cost_model.h"

using namespace spindle::plan;
using Approx = Catch::Detail::Approx;

namespace {
Cluster two_islands() {
  Cluster c;
  c.name = "test-2x8";
  c.islands = 2;
  c.devices_per_island = 8;
  c.device_name = "A800-SXM4-80GB";
  c.memory_gib = 80;
  c.peak_tflops = 312;
  c.memory_gbytes_per_s = 2039;
  c.intra_island = {200, 3};
  c.inter_island = {50, 8};
  return c;
}
Workload layer(int64_t batch) {
  Workload w;
  w.op = "transformer_layer";
  w.dims = {{"causal", false}, {"ffn", 5120}, {"heads", 16}, {"hidden", 1280}};
  w.seq = 257;
  w.batch = batch;
  return w;
}
}  // namespace

TEST_CASE("ring all-reduce inside and across islands, hand-computed") {
  const Cluster c = two_islands();
  // 8 devices of island 0, 1 GB: 2*7/8 * 1e9 / 200e9 s = 8.75 ms, + 2*7*3 us.
  CHECK(ring_allreduce_ms(c, 1e9, {0, 1, 2, 3, 4, 5, 6, 7}) == Approx(8.75 + 0.042));
  // 4 devices over two islands: inter link decides: 2*3/4 * 1e9 / 50e9 s = 30 ms, + 2*3*8 us.
  CHECK(ring_allreduce_ms(c, 1e9, {6, 7, 8, 9}) == Approx(30.0 + 0.048));
  // 2 devices in island 1: 1e9 / 200e9 s = 5 ms + 2*3 us.
  CHECK(ring_allreduce_ms(c, 1e9, {8, 15}) == Approx(5.006));
  CHECK(ring_allreduce_ms(c, 1e9, {3}) == 0.0);
  CHECK(ring_allreduce_ms(c, 1e9, {}) == 0.0);
}

TEST_CASE("TableCostModel returns what was set") {
  TableCostModel m(two_islands());
  auto curve = ScalingCurve::fit({{1, 10, 0}, {2, 6, 0}});
  REQUIRE(curve.ok());
  m.set(layer(256), *curve, 1000, 50);
  REQUIRE(m.curve(layer(256)) != nullptr);
  CHECK(m.curve(layer(256))->time_ms(2) == Approx(6));
  CHECK(m.curve(layer(128)) == nullptr);
  CHECK(m.param_bytes(layer(256)) == 1000);
  CHECK(m.activation_bytes_per_sample(layer(256)) == 50);
  CHECK(m.param_bytes(layer(128)) == 0);
  // 1 MB point to point: 3 us + 1e6 / 200e9 s inside; 8 us + 1e6 / 50e9 s across.
  CHECK(m.p2p_ms(1e6, false) == Approx(0.003 + 0.005));
  CHECK(m.p2p_ms(1e6, true) == Approx(0.008 + 0.02));
  CHECK(m.allreduce_ms(1e9, {0, 1}) == Approx(5.006));
}

TEST_CASE("ProfileCostModel fits every workload of the graph, and names a missing one") {
  Profile p;
  p.path = "profiles/test.json";
  p.device = "A800-SXM4-80GB";
  p.source = "analytic";
  ProfileEntry e;
  e.workload = layer(256);
  e.points = {{1, 61.2, 0}, {2, 31.0, 0}, {4, 15.9, 0}};
  e.param_bytes = 39362560;
  e.activation_bytes_per_sample = 9871360;
  p.entries.push_back(e);

  OpGraph g;
  Operator op;
  op.id = "image-text/img/1.0";
  op.param = "vision/1.0";
  op.workload = layer(256);
  g.ops.push_back(op);
  op.id = "image-text/img/1.1";
  g.ops.push_back(op);

  auto m = ProfileCostModel::create(p, two_islands(), g);
  REQUIRE(m.ok());
  const ScalingCurve* c = (*m)->curve(layer(256));
  REQUIRE(c != nullptr);
  CHECK(c->time_ms(2) == Approx(31.0));
  CHECK((*m)->param_bytes(layer(256)) == 39362560);
  CHECK((*m)->activation_bytes_per_sample(layer(256)) == 9871360);
  CHECK((*m)->allreduce_ms(1e9, {6, 7, 8, 9}) == Approx(30.048));
  // The optimizer step: unpriced without a rate; with one, 28 bytes per
  // value at it (1e6 values at 7 GB/s: 2.8e7 bytes, 4 ms).
  CHECK((*m)->optimizer_ms(1'000'000) == 0.0);
  p.optimizer_gbytes_per_s = 7.0;
  auto priced = ProfileCostModel::create(p, two_islands(), g);
  REQUIRE(priced.ok());
  CHECK((*priced)->optimizer_ms(1'000'000) == Approx(4.0));
  CHECK((*priced)->optimizer_ms(0) == 0.0);
  p.optimizer_gbytes_per_s.reset();
  // The operators' in-step scale (x-compute): every point's ms times it,
  // so the curve through them too; the points themselves stay as timed.
  p.compute_scale = 1.25;
  auto scaled = ProfileCostModel::create(p, two_islands(), g);
  REQUIRE(scaled.ok());
  const ScalingCurve* sc = (*scaled)->curve(layer(256));
  REQUIRE(sc != nullptr);
  for (int n : {1, 2, 3, 4, 8}) CHECK(sc->time_ms(n) == Approx(1.25 * c->time_ms(n)).epsilon(1e-9));
  CHECK(sc->time_ms(2) == Approx(38.75));   // 1.25 x 31.0
  CHECK(p.entries[0].points[1].ms == 31.0);
  p.compute_scale.reset();

  op.id = "image-text/img/1.2";
  op.workload = layer(128);
  g.ops.push_back(op);
  auto bad = ProfileCostModel::create(p, two_islands(), g);
  REQUIRE_FALSE(bad.ok());
  const std::string& msg = bad.error().message;
  CHECK_THAT(msg, Catch::Contains("profiles/test.json"));
  CHECK_THAT(msg, Catch::Contains("transformer_layer"));
  CHECK_THAT(msg, Catch::Contains("\"hidden\":1280"));
  CHECK_THAT(msg, Catch::Contains("seq 257"));
  CHECK_THAT(msg, Catch::Contains("batch 128"));
}

TEST_CASE("software overhead: the rules of rules/links.h and the cost model's all-reduce, hand-computed") {
  CommOverhead o;
  o.exchange_us = 10;
  o.message_us = 2;
  o.pack_gbytes_per_s = 4;
  o.allreduce_us = 30;
  // 1e6 bytes at 4 GB/s: 0.25 ms.
  CHECK(pack_ms(o, 1e6) == Approx(0.25));
  // 3 messages, 1e6 bytes sent: 10 + 3 * 2 us + 0.25 ms.
  CHECK(exchange_overhead_ms(o, 3, 1e6) == Approx(0.016 + 0.25));
  CHECK(exchange_overhead_ms(o, 0, 1e6) == 0.0);   // local copies only
  // 30 us; the gradients are views of the bucket's buffer: no copies.
  CHECK(collective_overhead_ms(o, Collective::allreduce, 1e6) == Approx(0.03));
  CHECK(pack_ms(CommOverhead{}, 1e6) == 0.0);
  CHECK_FALSE(CommOverhead{}.any());

  TableCostModel m(two_islands());
  CHECK(m.allreduce_ms(1e9, {0, 1}) == Approx(5.006));   // no overhead set: the ring formula
  m.set_overhead(o);
  CHECK(m.overhead().exchange_us == 10);
  // Ring 5.006 ms + 30 us.
  CHECK(m.allreduce_ms(1e9, {0, 1}) == Approx(5.006 + 0.03));
  CHECK(m.allreduce_ms(1e9, {3}) == 0.0);
  CHECK(m.p2p_ms(1e6, false) == Approx(0.003 + 0.005));   // messages keep the link formula

  // ZeRO-1's collectives: allreduce_us per call while their own figures are
  // absent, their own once set. The ring all-gather (and reduce-scatter) of
  // 1e9 bytes over devices 0 and 1 (one island, 200 GB/s, 3 us):
  // 1/2 x 1e9 / 2e11 s + 3 us = 2.503 ms; the all-gather's copies 2 x 0.25
  // ms at 1e6 bytes (the reduce-scatter runs on the gradients in place).
  CHECK(collective_overhead_ms(o, Collective::reduce_scatter, 1e6) == Approx(0.03));
  CHECK(collective_overhead_ms(o, Collective::allgather, 1e6) == Approx(0.53));
  CHECK(m.allgather_ms(1e9, {0, 1}) == Approx(2.503 + 0.03 + 500.0));
  CHECK(m.reduce_scatter_ms(1e9, {0, 1}) == Approx(2.503 + 0.03));
  o.reduce_scatter_us = 70;
  o.allgather_us = 0;
  CHECK(collective_overhead_ms(o, Collective::reduce_scatter, 1e6) == Approx(0.07));
  CHECK(collective_overhead_ms(o, Collective::allgather, 1e6) == Approx(0.50));
  CHECK(collective_overhead_ms(o, Collective::allreduce, 1e6) == Approx(0.03));   // its own, as before
  m.set_overhead(o);
  CHECK(m.reduce_scatter_ms(1e9, {0, 1}) == Approx(2.503 + 0.07));
  CHECK(m.allgather_ms(1e9, {0, 1}) == Approx(2.503 + 500.0));
  CHECK(m.allreduce_ms(1e9, {0, 1}) == Approx(5.006 + 0.03));
  CHECK(m.reduce_scatter_ms(1e9, {1}) == 0.0);
  CommOverhead only;
  only.allgather_us = 1;
  CHECK(only.any());
}
