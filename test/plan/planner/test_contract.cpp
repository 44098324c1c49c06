// Contraction into MetaOps and MetaLevels (docs/planner.md, step 2-3).
#include <catch2/catch.hpp>

#include "helpers.h"
#include "libplan/graph/contract.h"
#include "libplan/model/model.h"

using namespace spindle::plan;
using namespace spindle::plan::test;

TEST_CASE("contract: two chains make two MetaOps on two levels", "[contract]") {
  OpGraph g;
  const int a = add_chain(g, workload("transformer_layer", 64), 3, {});
  add_chain(g, workload("pool_project", 64), 2, {a});
  const Contraction c = contract(g);
  REQUIRE(c.metaops.size() == 2);
  CHECK(c.levels == 2);
  CHECK(c.metaops[0].operators == std::vector<int>{0, 1, 2});
  CHECK(c.metaops[0].level == 0);
  CHECK(c.metaops[0].inputs.empty());
  CHECK(c.metaops[1].operators == std::vector<int>{3, 4});
  CHECK(c.metaops[1].level == 1);
  CHECK(c.metaops[1].inputs == std::vector<int>{0});
  CHECK(c.metaops[1].length() == 2);
}

TEST_CASE("contract: a branch breaks the chain, a join too", "[contract]") {
  // 0 -> 1 -> {2, 3}; 2 -> 4 -> 5; 3 -> 6; {5, 6} -> 7 -> 8, all one workload.
  OpGraph g;
  const Workload w = workload("transformer_layer", 64);
  const int b = add_chain(g, w, 2, {});            // 0, 1
  const int left = add_chain(g, w, 1, {b});        // 2
  const int right = add_chain(g, w, 1, {b});       // 3
  const int left2 = add_chain(g, w, 2, {left});    // 4, 5
  const int right2 = add_chain(g, w, 1, {right});  // 6
  add_chain(g, w, 2, {left2, right2});             // 7, 8
  const Contraction c = contract(g);
  REQUIRE(c.metaops.size() == 4);
  CHECK(c.metaops[0].operators == std::vector<int>{0, 1});     // 1 has two consumers
  CHECK(c.metaops[1].operators == std::vector<int>{2, 4, 5});  // ids follow first operators
  CHECK(c.metaops[2].operators == std::vector<int>{3, 6});
  CHECK(c.metaops[3].operators == std::vector<int>{7, 8});     // 7 has two inputs
  CHECK(c.metaops[1].inputs == std::vector<int>{0});
  CHECK(c.metaops[2].inputs == std::vector<int>{0});
  CHECK(c.metaops[3].inputs == std::vector<int>{1, 2});
  CHECK(c.metaops[0].level == 0);
  CHECK(c.metaops[1].level == 1);
  CHECK(c.metaops[2].level == 1);
  CHECK(c.metaops[3].level == 2);
  CHECK(c.levels == 3);
}

TEST_CASE("contract: a workload change splits a chain, levels are longest paths", "[contract]") {
  // a(2) -> b(1) -> c(1) -> d(1), and a -> ... e(1) directly from a; join d, e -> f.
  OpGraph g;
  const int a = add_chain(g, workload("transformer_layer", 64), 2, {});
  const int bb = add_chain(g, workload("transformer_layer", 32), 1, {a});
  const int cc = add_chain(g, workload("linear", 32), 1, {bb});
  const int e = add_chain(g, workload("linear", 16), 1, {a});
  add_chain(g, workload("contrastive_loss", 16), 1, {cc, e});
  const Contraction c = contract(g);
  REQUIRE(c.metaops.size() == 5);
  CHECK(c.metaops[4].inputs == std::vector<int>{2, 3});
  CHECK(c.metaops[4].level == 3);   // a -> b -> c -> loss, not a -> e -> loss
  CHECK(c.metaops[3].level == 1);
  CHECK(c.levels == 4);
}

TEST_CASE("contract: a module shared by two tasks gives separate MetaOps", "[contract]") {
  const char* yaml = R"(
name: shared
modules:
  vision:
    - {op: patch_embed, in_dim: 48, hidden: 64}
    - {op: transformer_layer, repeat: 3, hidden: 64, heads: 4, ffn: 128}
    - {op: pool_project, in: 64, out: 32}
  text:
    - {op: token_embed, vocab: 100, hidden: 64}
    - {op: transformer_layer, repeat: 2, hidden: 64, heads: 4, ffn: 128, causal: true}
    - {op: pool_project, in: 64, out: 32}
  audio:
    - {op: patch_embed, in_dim: 48, hidden: 64}
    - {op: pool_project, in: 64, out: 32}
  loss:
    - {op: contrastive_loss, dim: 32}
tasks:
  - name: it
    batch: 8
    nodes:
      - {id: img, module: vision, seq: 16}
      - {id: txt, module: text, seq: 8}
      - {id: l, module: loss, inputs: [img, txt]}
  - name: at
    batch: 8
    nodes:
      - {id: aud, module: audio, seq: 16}
      - {id: txt, module: text, seq: 8}
      - {id: l, module: loss, inputs: [aud, txt]}
)";
  Result<Model> model = parse_model_string(yaml, "shared.yaml");
  REQUIRE(model.ok());
  const OpGraph g = expand(*model);
  const Contraction c = contract(g);
  // Task it: vision embed, 3 layers, pool; text embed, 2 layers, pool; loss = 7.
  // Task at: audio embed, pool; text embed, 2 layers, pool; loss = 6.
  REQUIRE(c.metaops.size() == 13);
  CHECK(c.levels == 4);
  std::vector<int> text_layers;
  for (const MetaOp& m : c.metaops) {
    if (m.workload.op == "transformer_layer" && m.workload.seq == 8) text_layers.push_back(m.id);
  }
  REQUIRE(text_layers.size() == 2);
  const MetaOp& a = c.metaops[static_cast<size_t>(text_layers[0])];
  const MetaOp& b = c.metaops[static_cast<size_t>(text_layers[1])];
  CHECK(a.task == 0);
  CHECK(b.task == 1);
  CHECK(a.length() == 2);
  CHECK(a.workload == b.workload);
  for (int k = 0; k < 2; ++k) {   // same parameters, different operators
    CHECK(g.ops[static_cast<size_t>(a.operators[static_cast<size_t>(k)])].param ==
          g.ops[static_cast<size_t>(b.operators[static_cast<size_t>(k)])].param);
    CHECK(a.operators[static_cast<size_t>(k)] != b.operators[static_cast<size_t>(k)]);
  }
  // MetaOp ids are a topological order.
  for (const MetaOp& m : c.metaops)
    for (int in : m.inputs) CHECK(in < m.id);
}
