// Expansion into the operator graph (spec/model.md "Operator graph", ids of
// spec/plan.md) on a hand-written two-task model.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "libplan/graph/op_graph.h"

using namespace spindle::plan;

namespace {

// Task "cap": img (vision: patch_embed, 2 layers, linear) and txt (text:
// token_embed) feed llm (trunk: 2 causal layers, lm_loss; tensor_parallel 2).
// Task "clip": img2 (vision_pool: patch_embed, pool_project, linear) and txt
// (text_pool: token_embed, pool_project) feed loss (contrastive_loss).
const char* kModel = R"(
name: graph
modules:
  vision:
    - {op: patch_embed, in_dim: 12, hidden: 8}
    - {op: transformer_layer, repeat: 2, hidden: 8, heads: 2, ffn: 16}
    - {op: linear, in: 8, out: 8}
  text:
    - {op: token_embed, vocab: 20, hidden: 8}
  trunk:
    blocks:
      - {op: transformer_layer, repeat: 2, hidden: 8, heads: 2, ffn: 16, causal: true}
      - {op: lm_loss, hidden: 8, vocab: 20}
    tensor_parallel: 2
  vision_pool:
    - {op: patch_embed, in_dim: 12, hidden: 8}
    - {op: pool_project, in: 8, out: 4}
    - {op: linear, in: 4, out: 4}
  text_pool:
    - {op: token_embed, vocab: 20, hidden: 8}
    - {op: pool_project, in: 8, out: 4}
  clip_loss:
    - {op: contrastive_loss, dim: 4}
tasks:
  - name: cap
    batch: 12
    nodes:
      - {id: img, module: vision, seq: 5}
      - {id: txt, module: text, seq: 3}
      - {id: llm, module: trunk, inputs: [img, txt]}
  - name: clip
    batch: 8
    nodes:
      - {id: txt, module: text_pool, seq: 6}
      - {id: img2, module: vision_pool, seq: 9}
      - {id: loss, module: clip_loss, inputs: [img2, txt]}
)";

}  // namespace

TEST_CASE("expand gives ids, params, seq, batch and edges per the spec", "[graph]") {
  Result<Model> m = parse_model_string(kModel, "graph.yaml");
  INFO((m.ok() ? std::string("ok") : m.error().message));
  REQUIRE(m.ok());
  const OpGraph g = expand(*m);

  struct Want {
    const char* id;
    const char* param;
    const char* op;
    int64_t seq;
    int64_t batch;
    int tp;
    std::vector<int> inputs;
    std::vector<int> outputs;
  };
  const std::vector<Want> want = {
      // task cap
      {"cap/img/0.0", "vision/0.0", "patch_embed", 5, 12, 1, {}, {1}},             // 0
      {"cap/img/1.0", "vision/1.0", "transformer_layer", 5, 12, 1, {0}, {2}},      // 1
      {"cap/img/1.1", "vision/1.1", "transformer_layer", 5, 12, 1, {1}, {3}},      // 2
      {"cap/img/2.0", "vision/2.0", "linear", 5, 12, 1, {2}, {5}},                 // 3
      {"cap/txt/0.0", "text/0.0", "token_embed", 3, 12, 1, {}, {5}},               // 4
      {"cap/llm/0.0", "trunk/0.0", "transformer_layer", 8, 12, 2, {3, 4}, {6}},    // 5
      {"cap/llm/0.1", "trunk/0.1", "transformer_layer", 8, 12, 2, {5}, {7}},       // 6
      {"cap/llm/1.0", "trunk/1.0", "lm_loss", 8, 12, 2, {6}, {}},                  // 7
      // task clip
      {"clip/txt/0.0", "text_pool/0.0", "token_embed", 6, 8, 1, {}, {9}},          // 8
      {"clip/txt/1.0", "text_pool/1.0", "pool_project", 6, 8, 1, {8}, {13}},       // 9
      {"clip/img2/0.0", "vision_pool/0.0", "patch_embed", 9, 8, 1, {}, {11}},      // 10
      {"clip/img2/1.0", "vision_pool/1.0", "pool_project", 9, 8, 1, {10}, {12}},   // 11
      {"clip/img2/2.0", "vision_pool/2.0", "linear", 1, 8, 1, {11}, {13}},         // 12
      {"clip/loss/0.0", "clip_loss/0.0", "contrastive_loss", 1, 8, 1, {9, 12}, {}},  // 13
  };
  REQUIRE(g.ops.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const Operator& op = g.ops[i];
    const Want& w = want[i];
    INFO("operator " << i << " " << op.id);
    CHECK(op.id == w.id);
    CHECK(op.param == w.param);
    CHECK(op.workload.op == w.op);
    CHECK(op.workload.seq == w.seq);
    CHECK(op.workload.batch == w.batch);
    CHECK(op.tensor_parallel == w.tp);
    CHECK(op.inputs == w.inputs);
    CHECK(op.outputs == w.outputs);
    for (int in : op.inputs) CHECK(in < static_cast<int>(i));
  }
  CHECK(g.ops[6].task == 0);
  CHECK(g.ops[6].node == 2);
  CHECK(g.ops[6].block == 0);
  CHECK(g.ops[6].rep == 1);
  CHECK(g.ops[13].task == 1);
  CHECK(g.ops[13].node == 2);
  CHECK(g.ops[5].workload.dims == m->find_module("trunk")->blocks[0].dims);
}

TEST_CASE("workload keys identify (op, dims, seq, batch)", "[graph]") {
  Result<Model> m = parse_model_string(kModel, "graph.yaml");
  REQUIRE(m.ok());
  const OpGraph g = expand(*m);
  CHECK(g.ops[1].workload.key() ==
        R"(transformer_layer{"causal":false,"ffn":16,"heads":2,"hidden":8}/s5/b12)");
  CHECK(g.ops[1].workload == g.ops[2].workload);   // the two vision layers
  CHECK_FALSE(g.ops[1].workload == g.ops[5].workload);  // causal differs
  CHECK(g.ops[13].workload.key() == R"(contrastive_loss{"dim":4,"temperature":0.07}/s1/b8)");
  // Same op and dims but another batch: another workload.
  CHECK_FALSE(g.ops[4].workload == g.ops[8].workload);
  CHECK((g.ops[4].workload < g.ops[8].workload) != (g.ops[8].workload < g.ops[4].workload));
}

TEST_CASE("workload keys write dims exactly as json::dump does, whatever the dims", "[graph]") {
  // Hostile dims (a reader rejects them, but error messages and lookups
  // still key them): names needing escapes, non-ASCII, negative, unsigned,
  // large and fractional numbers, null; a flat object's key is its dump().
  const std::vector<nlohmann::json> cases = {
      nlohmann::json::object(),
      {{"hidden", 8}, {"causal", true}, {"ffn", -3}},
      {{"a\"b", 1}, {"back\\slash", 2}, {"tab\t", 3}, {"\u00e9t\u00e9", 4}, {"\x7f", 5}},
      {{"big", 9007199254740993LL}, {"neg", -9223372036854775807LL - 1}, {"u", 18446744073709551615ULL}},
      {{"t", 0.07}, {"e", 1e300}, {"z", -0.0}, {"n", nullptr}, {"s", "text \"q\""}, {"f", false}},
  };
  for (const nlohmann::json& dims : cases) {
    Workload w{"linear", dims, 5, 12};
    CHECK(w.key() == "linear" + dims.dump() + "/s5/b12");
  }
  // A nested value is written "?" (never recursed into).
  Workload nested{"linear", {{"in", {{"deep", 1}}}, {"out", 2}}, 1, 1};
  CHECK(nested.key() == R"(linear{"in":?,"out":2}/s1/b1)");
  Workload not_object{"linear", nlohmann::json::array({1, 2}), 1, 1};
  CHECK(not_object.key() == "linear{}/s1/b1");
}

TEST_CASE("shared modules share parameter ids across tasks", "[graph]") {
  const std::string path = std::string(SPINDLE_SOURCE_DIR) + "/configs/models/tiny-clip.yaml";
  Result<Model> m = load_model(path);
  REQUIRE(m.ok());
  const OpGraph g = expand(*m);
  std::map<std::string, int> uses;
  for (const Operator& op : g.ops) ++uses[op.param];
  CHECK(uses["text/1.1"] == 2);      // image-text and audio-text
  CHECK(uses["vision/0.0"] == 2);    // image-text and audio-image
  CHECK(uses["clip_loss/0.0"] == 3);
  // tiny-clip: vision 4 ops, text 4, audio 3, loss 1 per use.
  CHECK(g.ops.size() == (4 + 4 + 1) + (3 + 4 + 1) + (3 + 4 + 1));
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    for (int o : g.ops[i].outputs) CHECK(o > static_cast<int>(i));
  }
}

TEST_CASE("one tensor_parallel per workload: a profile keys one curve per workload", "[graph]") {
  // enc's linear and trunk's first block compute the same workload
  // (linear 8 -> 8 at seq 4, batch 8) under tensor_parallel 1 and 2.
  const std::string model = R"(name: keys
modules:
  enc:
    - {op: token_embed, vocab: 16, hidden: 8}
    - {op: linear, in: 8, out: 8}
  trunk:
    blocks:
      - {op: linear, in: 8, out: 8}
      - {op: lm_loss, hidden: 8, vocab: 16}
    tensor_parallel: 2
tasks:
  - name: t
    batch: 8
    nodes:
      - {id: e, module: enc, seq: 4}
      - {id: lm, module: trunk, inputs: [e]}
)";
  Result<Model> m = parse_model_string(model, "keys.yaml");
  REQUIRE(m.ok());
  const Status st = check_profile_keys(*m, expand(*m));
  REQUIRE_FALSE(st.ok());
  // The trunk's block (line 8, column 9), both operators and both modules.
  CHECK_THAT(st.error().message, Catch::StartsWith("keys.yaml:8:9: modules.trunk: operator t/lm/0.0 (module 'trunk', "
                                                   "tensor_parallel 2) has the workload of operator t/e/1.0 "
                                                   "(module 'enc', tensor_parallel 1): linear{\"in\":8,\"out\":8}/s4/b8"));
  // The same tensor_parallel, or other dimensions: nothing to refuse.
  std::string same_tp = model;
  same_tp.replace(same_tp.find("tensor_parallel: 2"), 18, "tensor_parallel: 1");
  CHECK(check_profile_keys(parse_model_string(same_tp, "keys.yaml").value(),
                           expand(parse_model_string(same_tp, "keys.yaml").value()))
            .ok());
  std::string other_dims = model;
  const std::string enc = "hidden: 8}\n    - {op: linear, in: 8";
  other_dims.replace(other_dims.find(enc), enc.size(), "hidden: 6}\n    - {op: linear, in: 6");
  Result<Model> m2 = parse_model_string(other_dims, "keys.yaml");
  REQUIRE(m2.ok());
  CHECK(check_profile_keys(*m2, expand(*m2)).ok());
  // The hand-written model above: its vision and trunk layers differ (causal).
  Result<Model> g = parse_model_string(kModel, "graph.yaml");
  REQUIRE(g.ok());
  CHECK(check_profile_keys(*g, expand(*g)).ok());
}
