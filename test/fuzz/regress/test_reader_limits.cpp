// Regression tests of the reader bugs found while fuzzing (docs/hardening.md):
// each input was accepted with a value out of range, overflowed later, or
// made the reader throw. Each must now be an Error naming the file and key.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "libplan/io/profile.h"
#include "libplan/model/cluster.h"
#include "libplan/model/model.h"
#include "libplan/plan/plan_io.h"
#include "test/fuzz/regress/regress_helpers.h"

namespace sp = spindle::plan;
using spindle::plan::testing::error_of;
using spindle::plan::testing::slurp;

namespace {

const std::string kCorpus = std::string(SPINDLE_SOURCE_DIR) + "/test/fuzz/corpus/";

const char* kSizedCluster = R"(name: c
islands: ISLANDS
devices_per_island: 8
device: {name: d, memory_gib: MEMORY, peak_tflops: 1}
links:
  intra_island: {gbytes_per_s: 10, latency_us: 1}
  inter_island: {gbytes_per_s: 1, latency_us: 5}
)";

std::string sized_cluster(const std::string& islands, const std::string& memory) {
  std::string s = kSizedCluster;
  s.replace(s.find("ISLANDS"), 7, islands);
  s.replace(s.find("MEMORY"), 6, memory);
  return s;
}

const char* kModel = R"(name: m
modules:
  t: [{op: token_embed, vocab: 16, hidden: HIDDEN}]
  lm: [{op: transformer_layer, repeat: REPEAT, hidden: HIDDEN, heads: 1, ffn: 16}, {op: lm_loss, hidden: HIDDEN, vocab: 16}]
tasks:
  - {name: a, batch: 2, nodes: [{id: x, module: t, seq: SEQ}, {id: y, module: t, seq: SEQ}, {id: l, module: lm, inputs: [x, y]}]}
)";

std::string model_with(const std::string& hidden, const std::string& repeat, const std::string& seq) {
  std::string s = kModel;
  for (auto [key, value] : {std::pair<std::string, std::string>{"HIDDEN", hidden}, {"REPEAT", repeat}, {"SEQ", seq}}) {
    for (auto at = s.find(key); at != std::string::npos; at = s.find(key)) s.replace(at, key.size(), value);
  }
  return s;
}

}  // namespace

TEST_CASE("JSON readers: a number too large for a double is an error, not an exception", "[fuzz]") {
  const std::string profile = slurp(kCorpus + "profile/regress-number-overflow.json");
  CHECK(error_of(sp::parse_profile_string(profile, "p.json")).find("p.json: not valid JSON") == 0);
  const std::string plan = slurp(kCorpus + "plan/regress-number-overflow.json");
  CHECK(error_of(sp::parse_plan_string(plan, "q.json")).find("q.json: not valid JSON") == 0);
  CHECK_FALSE(sp::parse_plan_string("[1e400]", "q.json").ok());
  CHECK_FALSE(sp::parse_profile_string("{\"format\": -1e400}", "p.json").ok());
}

TEST_CASE("plan reader: integers out of int range are errors, not truncated", "[fuzz]") {
  const std::string text = slurp(kCorpus + "plan/tiny-lm.compact.json");
  REQUIRE(sp::parse_plan_string(text, "q.json").ok());
  const nlohmann::json good = nlohmann::json::parse(text);

  nlohmann::json doc = good;
  doc["cluster"]["devices"] = int64_t{4294967299};   // was read as 3
  std::string e = error_of(sp::parse_plan_string(doc.dump(), "q.json"));
  CHECK(e.find("cluster.devices") != std::string::npos);
  CHECK(e.find("expected an integer from 1 to 1000000, found 4294967299") != std::string::npos);

  doc = good;
  doc["waves"][0]["slices"][0]["devices"][0] = int64_t{-4294967296};   // was read as device 0
  e = error_of(sp::parse_plan_string(doc.dump(), "q.json"));
  CHECK(e.find("waves[0].slices[0].devices[0]") != std::string::npos);

  doc = good;
  doc["metaops"][0]["id"] = uint64_t{18446744073709551615u};   // was read as -1
  e = error_of(sp::parse_plan_string(doc.dump(), "q.json"));
  CHECK(e.find("metaops[0].id") != std::string::npos);
  CHECK(e.find("out of range") != std::string::npos);

  doc = good;
  doc["predicted"]["memory_bytes"][0] = uint64_t{9223372036854775808u};   // was read as INT64_MIN
  e = error_of(sp::parse_plan_string(doc.dump(), "q.json"));
  CHECK(e.find("predicted.memory_bytes[0]") != std::string::npos);
}

TEST_CASE("cluster reader: device count and memory that overflow are errors", "[fuzz]") {
  REQUIRE(sp::parse_cluster_string(sized_cluster("125000", "80"), "c.yaml").ok());   // 10^6 devices
  std::string e = error_of(sp::parse_cluster_string(sized_cluster("125001", "80"), "c.yaml"));
  CHECK(e.find("c.yaml:3:21: devices_per_island:") == 0);
  CHECK(e.find("1000008 devices") != std::string::npos);

  REQUIRE(sp::parse_cluster_string(sized_cluster("1", "1048576"), "c.yaml").ok());
  e = error_of(sp::parse_cluster_string(sized_cluster("1", "1e300"), "c.yaml"));
  CHECK(e.find("c.yaml:4:31: device.memory_gib:") == 0);
}

TEST_CASE("model reader: sizes and parameter counts that overflow are errors", "[fuzz]") {
  // 2 x seq 8 -> seq 16 into lm; every count below 10^15.
  auto ok = sp::parse_model_string(model_with("8", "1", "8"), "m.yaml");
  REQUIRE(ok.ok());
  CHECK(ok->parameter_count() > 0);

  std::string e = error_of(sp::parse_model_string(model_with("999999999999999999", "1", "8"), "m.yaml"));
  CHECK(e.find("m.yaml:3:") == 0);
  CHECK(e.find("modules.t[0].hidden: expected at most 1000000000, found 999999999999999999") != std::string::npos);

  // hidden 10^9: one transformer layer has 4*10^18 + ... parameters, which
  // fits in int64_t; 1000 of them do not.
  e = error_of(sp::parse_model_string(model_with("1000000000", "1000", "8"), "m.yaml"));
  CHECK(e.find("m.yaml:") == 0);
  CHECK(e.find("modules.lm: the model has more than 1000000000000000 parameters") != std::string::npos);

  // Two inputs of seq 6*10^8 give the trunk seq 1.2*10^9.
  e = error_of(sp::parse_model_string(model_with("8", "1", "600000000"), "m.yaml"));
  CHECK(e.find("tasks[0].nodes[2].inputs: sequence length 1200000000") != std::string::npos);
}
