// Parsing valid model descriptions: shipped configs, defaults, S, derived seq.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "libplan/model/model.h"
#include "libplan/util/files.h"

using namespace spindle::plan;

namespace {

Model load_shipped_model(const std::string& name) {
  const std::string path = std::string(SPINDLE_SOURCE_DIR) + "/configs/models/" + name + ".yaml";
  Result<Model> m = load_model(path);
  INFO(path << ": " << (m.ok() ? std::string("ok") : m.error().message));
  REQUIRE(m.ok());
  return std::move(m).value();
}

Model parse(const std::string& text) {
  Result<Model> m = parse_model_string(text, "inline.yaml");
  INFO((m.ok() ? std::string("ok") : m.error().message));
  REQUIRE(m.ok());
  return std::move(m).value();
}

const char* kTwoPairs = R"(
name: two
x: {anything: [goes, here]}
modules:
  vision:
    - {op: patch_embed, in_dim: 48, hidden: 32, x-note: free}
    - {op: transformer_layer, repeat: 2, hidden: 32, heads: 4, ffn: 64}
    - {op: pool_project, in: 32, out: 16}
  text:
    - {op: token_embed, vocab: 64, hidden: 32}
    - {op: pool_project, in: 32, out: 16}
  clip_loss:
    - {op: contrastive_loss, dim: 16}
tasks:
  - name: a
    batch: 8
    nodes:
      - {id: img, module: vision, seq: 17}
      - {id: txt, module: text, seq: 8}
      - {id: loss, module: clip_loss, inputs: [img, txt]}
  - name: b
    batch: 4
    weight: 0.5
    x-comment: ignored
    nodes:
      - {id: txt, module: text, seq: 12}
      - {id: img, module: vision, seq: 9}
      - {id: loss, module: clip_loss, inputs: [txt, img], seq: 1}
)";

}  // namespace

TEST_CASE("tiny-clip parses with a hand-checked parameter count", "[model]") {
  const Model m = load_shipped_model("tiny-clip");
  CHECK(m.name == "tiny-clip");
  CHECK(m.dtype == DType::fp32);
  REQUIRE(m.modules.size() == 4);
  REQUIRE(m.tasks.size() == 3);
  CHECK(m.sha256.size() == 64);
  CHECK(m.find_module("vision")->max_seq == 17);
  CHECK(m.find_module("text")->max_seq == 8);
  CHECK(m.find_module("audio")->max_seq == 12);
  CHECK(m.find_module("clip_loss")->max_seq == 1);
  // By hand (spec/model.md table), S per module as above:
  //  vision: patch_embed 48*32 + 32 + 17*32 = 2112
  //          transformer_layer 4*32^2 + 2*32*64 + 64 + 9*32 = 8544, x2 = 17088
  //          pool_project 32*16 + 16 + 2*32 = 592            -> 19792
  //  text:   token_embed 64*32 + 8*32 = 2304, layers 17088, pool 592 -> 19984
  //  audio:  patch_embed 16*32 + 32 + 12*32 = 928, 1 layer 8544, pool 592 -> 10064
  //  clip_loss: 0                                  total 19792 + 19984 + 10064 = 49840
  CHECK(m.parameter_count() == 49840);
  CHECK(m.tasks[2].weight == Approx(0.5));
  CHECK(m.tasks[0].weight == Approx(1.0));
  const Node& loss = m.tasks[0].nodes[2];
  CHECK(loss.seq == 1);
  CHECK(loss.inputs == std::vector<std::string>{"img", "txt"});
}

TEST_CASE("tiny-lm parses: tensor_parallel, derived seq, parameter count", "[model]") {
  const Model m = load_shipped_model("tiny-lm");
  const Module* trunk = m.find_module("trunk");
  REQUIRE(trunk != nullptr);
  CHECK(trunk->tensor_parallel == 2);
  CHECK(trunk->is_loss());
  CHECK_FALSE(trunk->reads_data());
  CHECK(trunk->in_width() == 32);
  CHECK(trunk->out_width() == 0);
  CHECK(trunk->max_seq == 24);  // caption: 16 image + 8 text tokens
  CHECK(m.tasks[0].nodes[2].seq == 24);
  CHECK(m.tasks[1].nodes[1].seq == 16);
  CHECK(m.find_module("text")->max_seq == 16);
  // vision: 48*32+32+16*32 = 2080, layer 8544, linear 32*32+32 = 1056 -> 11680
  // text: 64*32 + 16*32 = 2560; trunk: 2*8544 + 32*64 + 64 = 19200; total 33440
  CHECK(m.parameter_count() == 33440);
}

TEST_CASE("every shipped model parses with the intended size", "[model][configs]") {
  struct Expect {
    const char* name;
    std::size_t tasks;
    double params_b;  // billions, +-3%
  };
  const Expect expected[] = {
      {"multitask-clip-4", 4, 1.18}, {"multitask-clip-7", 7, 1.20},
      {"multitask-clip-10", 10, 1.20}, {"ofasys-7", 7, 0.66},
      {"qwen-val-3", 3, 9.25},
  };
  for (const Expect& e : expected) {
    SECTION(e.name) {
      const Model m = load_shipped_model(e.name);
      CHECK(m.name == e.name);
      CHECK(m.tasks.size() == e.tasks);
      CHECK(static_cast<double>(m.parameter_count()) / 1e9 == Approx(e.params_b).epsilon(0.03));
      for (const Module& mod : m.modules) {
        INFO(mod.name);
        CHECK(mod.max_seq > 0);  // every shipped module is used
      }
    }
  }
}

TEST_CASE("multitask-clip-10 has ImageBind-huge encoders and heterogeneous batches", "[model][configs]") {
  const Model m = load_shipped_model("multitask-clip-10");
  const Module* v = m.find_module("vision");
  REQUIRE(v != nullptr);
  REQUIRE(v->blocks.size() == 3);
  CHECK(v->blocks[1].repeat == 32);
  CHECK(v->blocks[1].dim("hidden") == 1280);
  CHECK(v->blocks[1].dims["causal"] == false);
  CHECK(v->max_seq == 257);
  CHECK(m.find_module("text")->blocks[1].dims["causal"] == true);
  CHECK(m.find_module("clip_loss")->blocks[0].dims["temperature"].get<double>() == Approx(0.07));
  CHECK(m.tasks[0].name == "image-text");
  std::set<int64_t> batches;
  for (const Task& t : m.tasks) batches.insert(t.batch);
  CHECK(batches.size() >= 4);
}

TEST_CASE("qwen-val-3 concatenates adapters and text into the LLM", "[model][configs]") {
  const Model m = load_shipped_model("qwen-val-3");
  const Module* llm = m.find_module("llm");
  REQUIRE(llm != nullptr);
  CHECK(llm->tensor_parallel == 4);
  CHECK(m.tasks[0].nodes.back().seq == 256 + 128);
  CHECK(m.tasks[1].nodes.back().seq == 500 + 128);
  CHECK(m.tasks[2].nodes.back().seq == 256 + 500 + 128);
  CHECK(llm->max_seq == 884);
}

TEST_CASE("defaults are filled in and extension keys ignored", "[model]") {
  const Model m = parse(kTwoPairs);
  CHECK(m.dtype == DType::bf16);
  CHECK(dtype_bytes(m.dtype) == 2);
  CHECK(std::string(dtype_name(DType::fp32)) == "fp32");
  CHECK(m.path == "inline.yaml");
  CHECK(m.sha256 == sha256_hex(kTwoPairs));
  const Module& v = *m.find_module("vision");
  CHECK(v.reads_data());
  CHECK(v.pools());
  CHECK(v.out_width() == 16);
  CHECK(v.in_width() == 0);
  CHECK(v.tensor_parallel == 1);
  CHECK(v.blocks[0].repeat == 1);
  CHECK(v.blocks[0].dims == nlohmann::json{{"hidden", 32}, {"in_dim", 48}});
  CHECK(v.blocks[1].dims.dump() == R"({"causal":false,"ffn":64,"heads":4,"hidden":32})");
  CHECK(v.blocks[1].mark.line == 7);
  CHECK(v.blocks[1].mark.column == 7);
  CHECK(v.mark.line == 5);
  const Module& loss = *m.find_module("clip_loss");
  CHECK(loss.is_loss());
  CHECK(loss.in_width() == 16);
  CHECK(loss.blocks[0].dims["temperature"].get<double>() == Approx(0.07));
  CHECK(m.tasks[0].weight == 1.0);
  CHECK(m.tasks[1].weight == 0.5);
  CHECK(m.tasks[1].mark.line == 21);
}

TEST_CASE("S is the largest seq a module is used with, across tasks", "[model]") {
  const Model m = parse(kTwoPairs);
  CHECK(m.find_module("vision")->max_seq == 17);  // 17 in task a, 9 in task b
  CHECK(m.find_module("text")->max_seq == 12);    // 8 in task a, 12 in task b
  CHECK(m.find_module("clip_loss")->max_seq == 1);
  // Position tables follow S: vision 48*32+32+17*32, text 64*32+12*32.
  const int64_t layer = 4 * 32 * 32 + 2 * 32 * 64 + 64 + 9 * 32;
  const int64_t pool = 32 * 16 + 16 + 64;
  CHECK(m.parameter_count() ==
        (48 * 32 + 32 + 17 * 32) + 2 * layer + pool + (64 * 32 + 12 * 32) + pool);
}

TEST_CASE("seq is derived from the inputs, pooled outputs count as 1", "[model]") {
  const Model m = parse(R"(
name: derive
modules:
  a:
    - {op: patch_embed, in_dim: 4, hidden: 8}
  p:
    - {op: linear, in: 8, out: 8}
    - {op: pool_project, in: 8, out: 8}
  mix:
    blocks:
      - {op: transformer_layer, hidden: 8, heads: 2, ffn: 16}
      - {op: lm_loss, hidden: 8, vocab: 10}
    tensor_parallel: 2
tasks:
  - name: t
    batch: 6
    nodes:
      - {id: x, module: a, seq: 5}
      - {id: y, module: a, seq: 7}
      - {id: px, module: p, inputs: [x]}
      - {id: out, module: mix, inputs: [px, y, x]}
)");
  const Task& t = m.tasks[0];
  CHECK(t.nodes[2].seq == 5);
  CHECK(t.nodes[3].seq == 1 + 7 + 5);
  CHECK(m.find_module("mix")->max_seq == 13);
  CHECK(m.find_module("a")->max_seq == 7);
}

// CLIP's projection head as a module of its own, after the pooling: what
// reaches contrastive_loss is one token per sample either way. It was
// refused as "not pooled" since its own module has no pool_project; an
// input of seq above 1 still is.
TEST_CASE("contrastive_loss takes seq-1 inputs pooled before their own module", "[model]") {
  const std::string head = R"(
name: head
modules:
  enc:
    - {op: patch_embed, in_dim: 4, hidden: 8}
    - {op: pool_project, in: 8, out: 8}
  raw:
    - {op: patch_embed, in_dim: 4, hidden: 8}
  proj:
    - {op: linear, in: 8, out: 8}
  loss:
    - {op: contrastive_loss, dim: 8}
tasks:
  - name: t
    batch: 6
    nodes:
      - {id: a, module: enc, seq: 5}
      - {id: b, module: enc, seq: 3}
)";
  const Model m = parse(head + "      - {id: pa, module: proj, inputs: [a]}\n"
                               "      - {id: l, module: loss, inputs: [pa, b]}\n");
  CHECK(m.tasks[0].nodes[2].seq == 1);
  Result<Model> unpooled = parse_model_string(head + "      - {id: r, module: raw, seq: 3}\n"
                                                     "      - {id: pr, module: proj, inputs: [r]}\n"
                                                     "      - {id: l, module: loss, inputs: [pr, b]}\n",
                                              "u.yaml");
  REQUIRE_FALSE(unpooled.ok());
  CHECK_THAT(unpooled.error().message,
             Catch::Contains("tasks[0].nodes[4].inputs[0]: input 'pr' is not pooled: contrastive_loss needs [b, 1, 8] "
                             "inputs, but the output of module 'proj' has seq 3"));
}

TEST_CASE("a module with only lm_loss takes exactly one input", "[model]") {
  Result<Model> m = parse_model_string(R"(
name: lm
modules:
  a:
    - {op: token_embed, vocab: 10, hidden: 8}
  head:
    - {op: lm_loss, hidden: 8, vocab: 10}
tasks:
  - name: t
    batch: 6
    nodes:
      - {id: x, module: a, seq: 5}
      - {id: y, module: a, seq: 5}
      - {id: l, module: head, inputs: [x, y]}
)",
                                       "lm.yaml");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().message.find("lm.yaml:14:") == 0);
  CHECK(m.error().message.find("tasks[0].nodes[2].inputs") != std::string::npos);
  CHECK(m.error().message.find("lm_loss takes exactly one input, found 2") != std::string::npos);
}

TEST_CASE("self input is a cycle, duplicate task names and empty tasks are errors", "[model]") {
  const std::string mods = R"(
name: m
modules:
  a:
    - {op: token_embed, vocab: 10, hidden: 8}
  head:
    - {op: lm_loss, hidden: 8, vocab: 10}
)";
  Result<Model> self = parse_model_string(mods + R"(tasks:
  - name: t
    batch: 6
    nodes:
      - {id: l, module: head, inputs: [l]}
)",
                                          "s.yaml");
  REQUIRE_FALSE(self.ok());
  CHECK(self.error().message.find("s.yaml:12:") == 0);
  CHECK(self.error().message.find("creates a cycle") != std::string::npos);

  Result<Model> dup = parse_model_string(mods + R"(tasks:
  - {name: t, batch: 6, nodes: [{id: x, module: a, seq: 2}, {id: l, module: head, inputs: [x]}]}
  - {name: t, batch: 6, nodes: [{id: x, module: a, seq: 2}, {id: l, module: head, inputs: [x]}]}
)",
                                         "d.yaml");
  REQUIRE_FALSE(dup.ok());
  CHECK(dup.error().message.find("d.yaml:10:") == 0);
  CHECK(dup.error().message.find("tasks[1].name: duplicate task name 't'") != std::string::npos);

  Result<Model> none = parse_model_string(mods + "tasks: []\n", "n.yaml");
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().message.find("n.yaml:8:") == 0);
  CHECK(none.error().message.find("tasks: expected a non-empty list of tasks") != std::string::npos);

  Result<Model> weight = parse_model_string(mods + R"(tasks:
  - {name: t, batch: 6, weight: 0, nodes: [{id: x, module: a, seq: 2}, {id: l, module: head, inputs: [x]}]}
)",
                                            "w.yaml");
  REQUIRE_FALSE(weight.ok());
  CHECK(weight.error().message.find("tasks[0].weight: expected a positive loss weight") !=
        std::string::npos);
  // Past a double, or subnormal (strtod's ERANGE): said so, not "expected a
  // number"; the largest and least normal doubles are read.
  auto with_weight = [&](const std::string& w) {
    return parse_model_string(mods + "tasks:\n  - {name: t, batch: 6, weight: " + w +
                                  ", nodes: [{id: x, module: a, seq: 2}, {id: l, module: head, inputs: [x]}]}\n",
                              "r.yaml");
  };
  for (const std::string w : {"1e400", "1e-320", "-1e400"}) {
    CAPTURE(w);
    Result<Model> range = with_weight(w);
    REQUIRE_FALSE(range.ok());
    CHECK(range.error().message.find("r.yaml:9:") == 0);
    CHECK(range.error().message.find("tasks[0].weight: expected a number of magnitude 0 or 2.2250738585072014e-308 "
                                     "to 1.7976931348623157e+308, found '" + w + "'") != std::string::npos);
  }
  // The largest and least normal doubles are read as numbers, and then
  // refused as weights: a float loss weight of 1e-300 is 0, and of 1e300
  // inf (limits.h, kMinLossWeight..kMaxLossWeight).
  for (const std::string w : {"1.7976931348623157e308", "2.2250738585072014e-308", "1e-31", "1.01e38", "-1"}) {
    CAPTURE(w);
    Result<Model> outside = with_weight(w);
    REQUIRE_FALSE(outside.ok());
    CHECK(outside.error().message.find("r.yaml:9:") == 0);
    CHECK(outside.error().message.find("tasks[0].weight: expected a positive loss weight from 1e-30 to 1e+38, "
                                       "found " + w) != std::string::npos);
  }
  for (const std::string w : {"1e-30", "1e38", "0.5"}) {
    CAPTURE(w);
    Result<Model> inside = with_weight(w);
    REQUIRE(inside.ok());
    CHECK(inside->tasks[0].weight == std::stod(w));
  }

  Result<Model> notmap = parse_model_string("- just\n- a list\n", "l.yaml");
  REQUIRE_FALSE(notmap.ok());
  CHECK(notmap.error().message.find("l.yaml:1:1: expected a map") == 0);

  Result<Model> empty = parse_model_string("", "e.yaml");
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.error().message.find("e.yaml") == 0);
}
