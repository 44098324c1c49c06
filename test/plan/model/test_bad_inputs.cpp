// Every invalid input under test/data/{models,clusters}/bad/ is rejected with
// a message naming the file, the key path and the line (spec/README.md).
// The expected fragments are listed in test/data/models/bad/README.md too.
#include <catch2/catch.hpp>

#include <string>

#include "libplan/model/cluster.h"
#include "libplan/model/model.h"

using namespace spindle::plan;

namespace {

struct BadCase {
  const char* file;      // under test/data/
  const char* key;       // key path in the message
  int line;              // 1-based line in the message
  const char* fragment;  // part of "what"
};

std::string location(const BadCase& c) {
  return std::string(SPINDLE_TEST_DATA) + "/" + c.file;
}

void check_message(const BadCase& c, const std::string& message) {
  INFO("message: " << message);
  const std::string path = location(c);
  // "file:line:col: key: what"
  CHECK(message.rfind(path + ":" + std::to_string(c.line) + ":", 0) == 0);
  CHECK(message.find(": " + std::string(c.key) + ": ") != std::string::npos);
  CHECK(message.find(c.fragment) != std::string::npos);
}

}  // namespace

TEST_CASE("bad model files are rejected with file, key path, line and reason", "[model][bad]") {
  const BadCase cases[] = {
      {"models/bad/unknown-op.yaml", "modules.vision[1].op", 6, "unknown op 'conv2d'"},
      {"models/bad/unknown-key.yaml", "tasks[0].bacth", 13, "unknown key 'bacth'"},
      {"models/bad/missing-input.yaml", "tasks[0].nodes[2].inputs", 17, "missing inputs"},
      {"models/bad/unknown-input.yaml", "tasks[0].nodes[2].inputs[1]", 17, "unknown input 'tx'"},
      {"models/bad/cycle.yaml", "tasks[0].nodes[1].inputs[1]", 16, "creates a cycle"},
      {"models/bad/seq-mismatch.yaml", "tasks[0].nodes[2].seq", 17,
       "seq mismatch: expected 24"},
      {"models/bad/width-mismatch.yaml", "tasks[0].nodes[2].inputs[1]", 17,
       "input 'txt' has width 48"},
      {"models/bad/contrastive-one-input.yaml", "tasks[0].nodes[2].inputs", 17,
       "contrastive_loss needs exactly two pooled inputs, found 1"},
      {"models/bad/contrastive-unpooled.yaml", "tasks[0].nodes[2].inputs[0]", 14, "not pooled"},
      {"models/bad/task-without-loss.yaml", "tasks[0].nodes", 15, "has no loss node"},
      {"models/bad/nonpositive-batch.yaml", "tasks[0].batch", 13,
       "expected a positive batch size, found 0"},
      {"models/bad/tp-not-dividing-heads.yaml", "modules.trunk.tensor_parallel", 10,
       "tensor_parallel 3 must divide heads 4"},
      {"models/bad/malformed.yaml", "", 10, "malformed YAML"},
      {"models/bad/not-reaching-loss.yaml", "tasks[0].nodes[2]", 17,
       "node 'aux' does not reach a loss"},
      {"models/bad/missing-seq.yaml", "tasks[0].nodes[0].seq", 15, "missing required key 'seq'"},
      {"models/bad/duplicate-node-id.yaml", "tasks[0].nodes[1].id", 16, "duplicate node id 'img'"},
      {"models/bad/unknown-module.yaml", "tasks[0].nodes[0].module", 15, "unknown module 'vison'"},
      {"models/bad/heads-not-dividing-hidden.yaml", "modules.text[1].heads", 6,
       "heads 5 must divide hidden 32"},
      {"models/bad/module-width-chain.yaml", "modules.vision[2].in", 7,
       "expected input width 32"},
      {"models/bad/bad-dtype.yaml", "dtype", 3, "expected one of bf16, fp16, fp32, found 'int8'"},
      {"models/bad/loss-not-last.yaml", "modules.text[1].op", 6, "can only be the last block"},
      {"models/bad/loss-feeds-node.yaml", "tasks[0].nodes[2].inputs[0]", 14,
       "a loss cannot feed another node"},
      {"models/bad/missing-dim.yaml", "modules.text[1].ffn", 6, "missing required dimension 'ffn'"},
      {"models/bad/wrong-type-dim.yaml", "modules.text[0].hidden", 5,
       "expected an integer, found the quoted string '32'"},
      {"models/bad/missing-tasks.yaml", "tasks", 2, "missing required key 'tasks'"},
      {"models/bad/repeat-changes-width.yaml", "modules.vision[2].repeat", 7,
       "a block that repeats must keep its width, each copy feeding the next: pool_project in 32 to out 16"},
      {"models/bad/repeat-data-reader.yaml", "modules.vision[0].repeat", 5,
       "op 'patch_embed' reads data and cannot repeat (found repeat 2)"},
  };
  for (const BadCase& c : cases) {
    SECTION(c.file) {
      Result<Model> m = load_model(location(c));
      REQUIRE_FALSE(m.ok());
      const std::string& msg = m.error().message;
      if (std::string(c.key).empty()) {
        // Malformed YAML has no key path: "file:line:col: what".
        INFO("message: " << msg);
        CHECK(msg.rfind(location(c) + ":" + std::to_string(c.line) + ":", 0) == 0);
        CHECK(msg.find(c.fragment) != std::string::npos);
      } else {
        check_message(c, msg);
      }
    }
  }
}

TEST_CASE("unknown key reports line and column", "[model][bad]") {
  const std::string path = std::string(SPINDLE_TEST_DATA) + "/models/bad/unknown-key.yaml";
  Result<Model> m = load_model(path);
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().message.rfind(path + ":13:5: tasks[0].bacth: unknown key 'bacth'", 0) == 0);
}

TEST_CASE("bad cluster files are rejected with file, key path, line and reason",
          "[cluster][bad]") {
  const BadCase cases[] = {
      {"clusters/bad/zero-devices.yaml", "devices_per_island", 4, "at least one device"},
      {"clusters/bad/zero-islands.yaml", "islands", 3, "at least one device"},
      {"clusters/bad/unknown-key.yaml", "links.inter_island.bandwidth", 11,
       "unknown key 'bandwidth'"},
      {"clusters/bad/missing-key.yaml", "device.peak_tflops", 6, "missing required key 'peak_tflops'"},
      {"clusters/bad/negative-bandwidth.yaml", "links.intra_island.gbytes_per_s", 10,
       "expected a bandwidth (GB/s) from 0.001 to 1000000000.0, found -200"},
  };
  for (const BadCase& c : cases) {
    SECTION(c.file) {
      Result<Cluster> cl = load_cluster(location(c));
      REQUIRE_FALSE(cl.ok());
      check_message(c, cl.error().message);
    }
  }
}

TEST_CASE("a missing file is an error, not an exception", "[model][cluster][bad]") {
  Result<Model> m = load_model("/nonexistent/model.yaml");
  REQUIRE_FALSE(m.ok());
  CHECK(m.error().message.find("/nonexistent/model.yaml") != std::string::npos);
  Result<Cluster> c = load_cluster("/nonexistent/cluster.yaml");
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().message.find("/nonexistent/cluster.yaml") != std::string::npos);
}
