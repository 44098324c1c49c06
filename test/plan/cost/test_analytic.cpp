// The analytic cost model behind `spindle-profile --analytic`.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "libplan/cost/analytic.h"
#include "libplan/cost/cost_model.h"
#include "libplan/io/profile.h"
#include "libplan/model/cluster.h"
#include "libplan/model/ops.h"

using namespace spindle::plan;
using Approx = Catch::Detail::Approx;

namespace {
Cluster a800(int islands) {
  Cluster c;
  c.name = "a800";
  c.path = "clusters/a800.yaml";
  c.islands = islands;
  c.devices_per_island = 8;
  c.device_name = "A800-SXM4-80GB";
  c.memory_gib = 80;
  c.peak_tflops = 312;
  c.memory_gbytes_per_s = 2039;
  c.intra_island = {200, 3};
  c.inter_island = {50, 8};
  return c;
}
Workload layer(int64_t h, int64_t heads, int64_t ffn, int64_t s, int64_t batch, bool causal = false) {
  Workload w;
  w.op = "transformer_layer";
  w.dims = {{"causal", causal}, {"ffn", ffn}, {"heads", heads}, {"hidden", h}};
  w.seq = s;
  w.batch = batch;
  return w;
}

const char* kModel = R"(
name: analytic-test
modules:
  vision:
    - {op: patch_embed, in_dim: 588, hidden: 1280}
    - {op: transformer_layer, repeat: 2, hidden: 1280, heads: 16, ffn: 5120}
    - {op: pool_project, in: 1280, out: 1024}
  text:
    blocks:
      - {op: token_embed, vocab: 49408, hidden: 1024}
      - {op: transformer_layer, repeat: 2, hidden: 1024, heads: 16, ffn: 4096, causal: true}
      - {op: pool_project, in: 1024, out: 1024}
    tensor_parallel: 2
  clip_loss:
    - {op: contrastive_loss, dim: 1024}
tasks:
  - name: image-text
    batch: 12
    nodes:
      - {id: img,  module: vision, seq: 257}
      - {id: txt,  module: text,   seq: 77}
      - {id: loss, module: clip_loss, inputs: [img, txt]}
)";
}  // namespace

TEST_CASE("ViT-H layer FLOPs match 3 (24 s h^2 + 4 s^2 h) per sample") {
  const double s = 257, h = 1280;
  const double expected = 3 * (24 * s * h * h + 4 * s * s * h);
  CHECK(analytic_flops_per_sample(layer(1280, 16, 5120, 257, 256)) == Approx(expected));
  CHECK(expected == Approx(3.1331e10).epsilon(1e-4));
  // ffn != 4h: 3 (8 s h^2 + 4 s h ffn + 4 s^2 h); causal counted in full.
  const double s2 = 77, h2 = 1024, f2 = 3000;
  CHECK(analytic_flops_per_sample(layer(1024, 16, 3000, 77, 8, true)) ==
        Approx(3 * (8 * s2 * h2 * h2 + 4 * s2 * h2 * f2 + 4 * s2 * s2 * h2)));
}

TEST_CASE("transformer activations follow Korthikanti et al. for ffn = 4h, with fused attention") {
  // Korthikanti et al.: s h (34 + 5 a s / h) bytes in 16-bit; fused (flash)
  // attention keeps no s x s matrices, only an fp32 log-sum-exp per head and
  // row: 34 s h + 4 a s.
  const double s = 257, h = 1280, a = 16;
  CHECK(analytic_activation_bytes_per_sample(layer(1280, 16, 5120, 257, 256), DType::bf16) ==
        std::llround(s * h * 34 + 4 * a * s));
  CHECK(analytic_activation_bytes_per_sample(layer(1280, 16, 5120, 257, 256), DType::fp32) ==
        std::llround(2 * s * h * 34 + 4 * a * s));
}

TEST_CASE("per-sample time falls as the local batch grows (efficiency rises)") {
  const Cluster c = a800(8);
  for (const Workload& w : {layer(1280, 16, 5120, 257, 256), layer(384, 8, 1536, 197, 256)}) {
    double prev_per_sample = 0;
    for (int n : {64, 32, 16, 8, 4, 2, 1}) {   // local batch 4 .. 256
      const double t = analytic_op_ms(w, 1, n, c, DType::bf16);
      const double per_sample = t / (256.0 / n);
      if (prev_per_sample > 0) CHECK(per_sample < prev_per_sample);
      prev_per_sample = per_sample;
    }
  }
  // Achieved efficiency of a ViT-H layer: high at batch 256, low at 4 samples.
  const Workload w = layer(1280, 16, 5120, 257, 256);
  const double flops = analytic_flops_per_sample(w) * 256;
  const double eff1 = flops / (analytic_op_ms(w, 1, 1, c, DType::bf16) * 1e-3) / 312e12;
  const double eff64 = flops / 64 / (analytic_op_ms(w, 1, 64, c, DType::bf16) * 1e-3) / 312e12;
  CHECK(eff1 > 0.6);
  CHECK(eff1 < analytic_constants().efficiency_max);
  CHECK(eff64 < eff1);
  // A light layer scales worse than a heavy one.
  const Workload light = layer(384, 8, 1536, 197, 256);
  const double heavy_speedup = analytic_op_ms(w, 1, 1, c, DType::bf16) / analytic_op_ms(w, 1, 64, c, DType::bf16);
  const double light_speedup =
      analytic_op_ms(light, 1, 1, c, DType::bf16) / analytic_op_ms(light, 1, 64, c, DType::bf16);
  CHECK(light_speedup < heavy_speedup);
}

TEST_CASE("valid device counts honour tensor parallelism and the batch") {
  const Cluster c = a800(2);
  // Rule 4: n a multiple of K = 2 with n / 2 dividing 12 (8: 4 groups of 3 rows).
  CHECK(analytic_valid_counts(12, 2, c, nullptr) == std::vector<int>{2, 4, 6, 8, 12});
  CHECK(analytic_valid_counts(12, 1, c, nullptr) == std::vector<int>{1, 2, 3, 4, 6, 12});
  const std::vector<int> list{1, 2, 4, 8, 16};
  CHECK(analytic_valid_counts(12, 2, c, &list) == std::vector<int>{2, 4, 8});  // 16: 8 groups do not split 12
}

// kModel's analytic profile on a800(islands), with the model and graph.
struct SmallProfile {
  Model model;
  OpGraph graph;
  Cluster cluster;
  Profile profile;
};
SmallProfile small_profile(int islands) {
  auto model = parse_model_string(kModel, "analytic-test.yaml");
  REQUIRE(model.ok());
  SmallProfile s{*model, expand(*model), a800(islands), {}};
  auto p = analytic_profile(s.model, s.graph, s.cluster, nullptr);
  REQUIRE(p.ok());
  s.profile = std::move(*p);
  return s;
}

TEST_CASE("analytic profile of a small model: one entry per workload, TP points only at valid counts") {
  const SmallProfile small = small_profile(2);
  const Model& model = small.model;
  const OpGraph& g = small.graph;
  const Cluster& c = small.cluster;
  const Profile* p = &small.profile;
  CHECK(p->device == "A800-SXM4-80GB");
  CHECK(p->source == "analytic");
  // Software overhead: NCCL-like launch costs, copies at half the memory bandwidth.
  REQUIRE(p->overhead.has_value());
  CHECK(p->overhead->exchange_us == 5.0);
  CHECK(p->overhead->message_us == 1.0);
  CHECK(p->overhead->allreduce_us == 5.0);
  CHECK(p->overhead->pack_gbytes_per_s == Approx(c.memory_gbytes_per_s / 2));
  // The optimizer step at the device's memory bandwidth.
  REQUIRE(p->optimizer_gbytes_per_s.has_value());
  CHECK(*p->optimizer_gbytes_per_s == c.memory_gbytes_per_s);
  CHECK(p->entries.size() == 7);   // patch, layer, pool; token, layer, pool; loss
  for (const auto& e : p->entries) {
    const bool text = e.workload.seq == 77 || e.workload.op == "token_embed" ||
                      (e.workload.op == "pool_project" && e.workload.dims["in"] == 1024);
    std::vector<int> counts;
    for (const auto& pt : e.points) counts.push_back(pt.devices);
    INFO(e.workload.key());
    if (text) {
      CHECK(counts == std::vector<int>{2, 4, 6, 8, 12});   // multiples of 2 whose half divides 12
    } else {
      CHECK(counts == std::vector<int>{1, 2, 3, 4, 6, 12});
    }
    // Compute-bound ops speed up with more devices; contrastive_loss on 12
    // samples does not (its gathers grow with n): the profile says so and the
    // curve fit flattens it.
    if (e.workload.op != "contrastive_loss") {
      for (size_t i = 1; i < e.points.size(); ++i) CHECK(e.points[i].ms < e.points[i - 1].ms);
    }
    CHECK(e.points.front().ms > 0);
    if (e.workload.op == "transformer_layer" && e.workload.seq == 257) {
      CHECK(e.param_bytes == op_param_count("transformer_layer", e.workload.dims, 257) * 2);
    }
    if (e.workload.op == "patch_embed") {
      // Positions are counted over the module's max_seq.
      CHECK(e.param_bytes == (588 * 1280 + 1280 + 257 * 1280) * 2);
    }
  }
  // Deterministic bytes.
  auto q = analytic_profile(model, g, c, nullptr);
  REQUIRE(q.ok());
  CHECK(profile_to_json(*p) == profile_to_json(*q));

  const std::vector<int> list{1, 2, 4, 8, 16};
  auto r = analytic_profile(model, g, c, &list);
  REQUIRE(r.ok());
  for (const auto& e : r->entries) {
    std::vector<int> counts;
    for (const auto& pt : e.points) counts.push_back(pt.devices);
    CHECK((counts == std::vector<int>{1, 2, 4} || counts == std::vector<int>{2, 4, 8}));
  }
}

TEST_CASE("an analytic profile in memory holds exactly what its file holds") {
  // spindle-plan without --profile plans from the profile in memory; with
  // the file spindle-profile wrote it must get the same plan, so every
  // figure is already rounded as the file stores it (profile_figure).
  const SmallProfile small = small_profile(4);
  const Profile* p = &small.profile;
  auto back = parse_profile_string(profile_to_json(*p), "analytic.json");
  REQUIRE(back.ok());
  REQUIRE(back->entries.size() == p->entries.size());
  int points = 0;
  for (size_t i = 0; i < p->entries.size(); ++i) {
    REQUIRE(back->entries[i].points.size() == p->entries[i].points.size());
    for (size_t k = 0; k < p->entries[i].points.size(); ++k) {
      CHECK(back->entries[i].points[k].ms == p->entries[i].points[k].ms);   // bit for bit
      CHECK(p->entries[i].points[k].ms == profile_figure(p->entries[i].points[k].ms));
      ++points;
    }
  }
  CHECK(points > 20);
  REQUIRE(back->overhead.has_value());
  CHECK(back->overhead->pack_gbytes_per_s == p->overhead->pack_gbytes_per_s);
  // Six significant digits, by hand.
  CHECK(profile_figure(0.1294684321) == 0.129468);
  CHECK(profile_figure(1019.5) == 1019.5);
  CHECK(profile_figure(123456789.0) == 123457000.0);
}

TEST_CASE("analytic profile errors name the cluster key") {
  auto model = parse_model_string(kModel, "analytic-test.yaml");
  REQUIRE(model.ok());
  const OpGraph g = expand(*model);
  Cluster c = a800(1);
  c.memory_gbytes_per_s = 0;
  auto p = analytic_profile(*model, g, c, nullptr);
  REQUIRE_FALSE(p.ok());
  CHECK_THAT(p.error().message, Catch::Contains("clusters/a800.yaml"));
  CHECK_THAT(p.error().message, Catch::Contains("device.memory_gbytes_per_s"));
  // A file without the key: its line and column are the device map's
  // (the key the error asks for is not there to point at).
  auto file = parse_cluster_string(R"(name: nobw
islands: 1
devices_per_island: 2
device:
  name: cpu-core
  memory_gib: 4
  peak_tflops: 0.05
links:
  intra_island: {gbytes_per_s: 5, latency_us: 20}
  inter_island: {gbytes_per_s: 1, latency_us: 50}
)",
                                   "nobw.yaml");
  REQUIRE(file.ok());
  auto f = analytic_profile(*model, g, *file, nullptr);
  REQUIRE_FALSE(f.ok());
  CHECK_THAT(f.error().message,
             Catch::StartsWith("nobw.yaml:5:3: device.memory_gbytes_per_s: an analytic profile needs the device memory "
                               "bandwidth in GB/s"));

  // Sizes within the model's limits whose time a profile cannot hold
  // (over 10^9 ms): named at the node that uses the workload (the
  // message had no line or key).
  auto huge = parse_model_string(R"(name: huge
dtype: fp32
modules:
  text:
    - {op: token_embed, vocab: 4, hidden: 4}
  lm:
    - {op: lm_loss, hidden: 4, vocab: 4}
tasks:
  - name: t
    batch: 1000000000
    nodes:
      - {id: x, module: text, seq: 1000000000}
      - {id: l, module: lm, inputs: [x]}
)",
                                 "huge.yaml");
  REQUIRE(huge.ok());
  auto h = analytic_profile(*huge, expand(*huge), a800(1), nullptr);
  REQUIRE_FALSE(h.ok());
  CHECK_THAT(h.error().message, Catch::StartsWith("huge.yaml:13:9: tasks[0].nodes[1]: operator t/l/0.0 (lm_loss): would "
                                                  "take ") &&
                                    Catch::EndsWith("ms a profile may hold; a smaller batch, sequence or widths"));

  const std::vector<int> too_many{1, 64};
  auto q = analytic_profile(*model, g, a800(1), &too_many);
  REQUIRE_FALSE(q.ok());
  CHECK_THAT(q.error().message, Catch::Contains("--devices"));
}

TEST_CASE("a --devices list that gives an operator one point where several counts are valid is refused") {
  // spindle-plan refuses such a profile (spec/profile.md: at least two
  // points wherever more than one count is valid), so it is not written.
  auto model = load_model(std::string(SPINDLE_SOURCE_DIR) + "/configs/models/tiny-lm.yaml");
  REQUIRE(model.ok());
  const OpGraph g = expand(*model);
  auto cluster = load_cluster(std::string(SPINDLE_SOURCE_DIR) + "/configs/clusters/cpu-1x4.yaml");
  REQUIRE(cluster.ok());
  const std::vector<int> two{2};
  auto one = analytic_profile(*model, g, *cluster, &two);
  REQUIRE_FALSE(one.ok());
  CHECK_THAT(one.error().message, Catch::Contains("gets one point (2 devices), but 1,2,3,4 are valid on the 4 devices"));
  CHECK_THAT(one.error().message, Catch::Contains("spindle-plan would refuse it"));
  // {1, 2} leaves the TP-2 trunk (valid on 2 and 4) one point too.
  const std::vector<int> low{1, 2};
  auto trunk = analytic_profile(*model, g, *cluster, &low);
  REQUIRE_FALSE(trunk.ok());
  CHECK_THAT(trunk.error().message, Catch::Contains("tensor_parallel 2) gets one point (2 devices), but 2,4 are valid"));
  // What it refuses is what the planner refuses: with two counts each, it plans.
  const std::vector<int> pair{2, 4};
  auto ok = analytic_profile(*model, g, *cluster, &pair);
  REQUIRE(ok.ok());
  CHECK(ProfileCostModel::create(*ok, *cluster, g).ok());
  // On one device a single point is all there is.
  auto single = load_cluster(std::string(SPINDLE_SOURCE_DIR) + "/configs/clusters/cpu-1x1.yaml");
  REQUIRE(single.ok());
  auto clip = load_model(std::string(SPINDLE_SOURCE_DIR) + "/configs/models/tiny-clip.yaml");
  REQUIRE(clip.ok());
  const OpGraph g1 = expand(*clip);
  const std::vector<int> just_one{1};
  auto lone = analytic_profile(*clip, g1, *single, &just_one);
  REQUIRE(lone.ok());
  CHECK(ProfileCostModel::create(*lone, *single, g1).ok());
}

TEST_CASE("analytic time of a tensor-parallel layer, by hand") {
  const Cluster c = a800(1);
  const Workload w = layer(1024, 16, 4096, 77, 8);
  const double s = 77, h = 1024, f = 4096;
  const double flops = 3 * (8 * s * h * h + 4 * s * h * f + 4 * s * s * h);
  const int64_t params = op_param_count("transformer_layer", w.dims, 77) * 2;
  // K = 2 on n = 2: one TP group, local batch 8; each device does half the FLOPs.
  const double peak_per_ms = 312e12 * 1e-3;
  const double compute = (flops * 8 / 2 + 64e-3 * peak_per_ms) / (0.65 * peak_per_ms);
  const double kept = s * (18 * h + 4 * f) + 5 * 16 * s * s, out = s * h * 2;
  const double memory = 3 * (params / 2.0 + 8 / 2.0 * (kept + out)) / 2039e9 * 1e3;
  const double ar_bytes = 8 * s * h * 2;
  const double comm = 4 * (2 * 0.5 * ar_bytes / 200e9 * 1e3 + 2 * 0.003);
  CHECK(analytic_op_ms(w, 2, 2, c, DType::bf16) == Approx(std::max(compute, memory) + comm + 0.03));
  // Without TP on one device: all FLOPs, no all-reduce.
  const double compute1 = (flops * 8 + 64e-3 * peak_per_ms) / (0.65 * peak_per_ms);
  const double memory1 = 3 * (params + 8 * (kept + out)) / 2039e9 * 1e3;
  CHECK(analytic_op_ms(w, 1, 1, c, DType::bf16) == Approx(std::max(compute1, memory1) + 0.03));
}

TEST_CASE("model FLOPs per step: every operator of every task at its batch, by hand") {
  // s = 4, h = 8, ffn 16, vocab 16, per sample (forward + backward):
  //   token_embed 3 s h = 96; transformer_layer 3 (8 s h^2 + 4 s h f +
  //   4 s^2 h) = 3 (2048 + 2048 + 512) = 13824; lm_loss 3 (2 s h v + 8 s h +
  //   5 s v) = 3 (1024 + 256 + 320) = 4800; in all 18720.
  // Two tasks use the same modules, at batches 2 and 6: 8 x 18720.
  const char* yaml = R"(name: flops
dtype: bf16
modules:
  text: [{op: token_embed, vocab: 16, hidden: 8}, {op: transformer_layer, hidden: 8, heads: 2, ffn: 16}]
  head: [{op: lm_loss, hidden: 8, vocab: 16}]
tasks:
  - {name: a, batch: 2, nodes: [{id: txt, module: text, seq: 4}, {id: llm, module: head, inputs: [txt]}]}
  - {name: b, batch: 6, nodes: [{id: txt, module: text, seq: 4}, {id: llm, module: head, inputs: [txt]}]}
)";
  auto model = parse_model_string(yaml, "flops.yaml");
  REQUIRE(model.ok());
  CHECK(model_flops_per_step(expand(*model)) == 8.0 * 18720.0);
}
