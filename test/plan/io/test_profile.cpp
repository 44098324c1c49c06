// Profile database reader and writer (spec/profile.md).
#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <vector>

#include "libplan/io/profile.h"

using namespace spindle::plan;

namespace {
Profile sample() {
  Profile p;
  p.device = "A800-SXM4-80GB";
  p.source = "analytic";
  ProfileEntry lin;
  lin.workload.op = "linear";
  lin.workload.dims = {{"in", 1024}, {"out", 1024}};
  lin.workload.seq = 77;
  lin.workload.batch = 256;
  lin.points = {{1, 1.23456789, 0}, {2, 0.6172839451, 0}, {3, 0.41152263, 0}};
  lin.param_bytes = 2099200;
  lin.activation_bytes_per_sample = 157696;
  ProfileEntry layer;
  layer.workload.op = "transformer_layer";
  layer.workload.dims = {{"causal", false}, {"ffn", 5120}, {"heads", 16}, {"hidden", 1280}};
  layer.workload.seq = 257;
  layer.workload.batch = 256;
  layer.points = {{1, 61.2, 0}, {2, 31.0000001, 0}, {4, 15.9, 0}};
  layer.param_bytes = 39362560;
  layer.activation_bytes_per_sample = 9871360;
  ProfileEntry loss;
  loss.workload.op = "contrastive_loss";
  loss.workload.dims = {{"dim", 1024}, {"temperature", 0.07}};
  loss.workload.seq = 1;
  loss.workload.batch = 256;
  loss.points = {{1, 0.5, 0.02}, {2, 0.3, 0}};
  // Written out of key order: the writer sorts.
  p.entries = {layer, lin, loss};
  return p;
}

std::string bad(const std::string& name) { return std::string(SPINDLE_TEST_DATA) + "/profiles/bad/" + name; }

// `text` with its first `figure` (e.g. "\"exchange_us\":5") replaced by
// `with`, read as v3.json: the reader's error (the test fails where the
// text has no such figure or is read without one).
std::string refused(std::string text, const std::string& figure, const std::string& with) {
  const size_t at = text.find(figure);
  REQUIRE(at != std::string::npos);
  text.replace(at, figure.size(), with);
  auto r = parse_profile_string(text, "v3.json");
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}
// Each of `bad` put in the place of the first `was` in `bytes`: refused,
// the message naming p.json and `key`.
void check_each_refused(const std::string& bytes, const std::string& was, const std::vector<std::string>& bad,
                        const std::string& key) {
  for (const std::string& b : bad) {
    std::string text = bytes;
    const size_t at = text.find(was);
    REQUIRE(at != std::string::npos);
    text.replace(at, was.size(), b);
    auto r = parse_profile_string(text, "p.json");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("p.json") && Catch::Contains(key));
  }
}

// A one-number extension key (parse_one_figure): absent unless set, written
// with 6 significant digits as `stored`, read back as written, and refused,
// naming it, with a bad number or a bad object.
void check_one_figure(std::optional<double> Profile::*field, const std::string& key, const std::string& number,
                      double value, const std::string& stored, const std::vector<std::string>& bad_numbers) {
  Profile p = sample();
  CHECK_FALSE((parse_profile_string(profile_to_json(p), "p.json").value().*field).has_value());
  p.*field = value;
  const std::string bytes = profile_to_json(p);
  const std::string object = "{\"" + number + "\":" + stored + "}";
  CHECK(bytes.find("\"" + key + "\": " + object) != std::string::npos);
  auto back = parse_profile_string(bytes, "p.json");
  REQUIRE(back.ok());
  REQUIRE((*back.*field).has_value());
  CHECK(*(*back.*field) == std::stod(stored));
  CHECK(profile_to_json(*back) == bytes);
  check_each_refused(bytes, stored, bad_numbers, key + "." + number);
  check_each_refused(bytes, object, {"{}", "{\"" + number + "\":1,\"extra\":2}", "[1]"}, key);
}
}  // namespace

TEST_CASE("profile encode, decode, encode is byte-identical") {
  const std::string a = profile_to_json(sample());
  auto p = parse_profile_string(a, "mem.json");
  REQUIRE(p.ok());
  const std::string b = profile_to_json(*p);
  CHECK(a == b);
  auto q = parse_profile_string(b, "mem.json");
  REQUIRE(q.ok());
  CHECK(profile_to_json(*q) == b);
  // Entries sorted by workload key, ms rounded to 6 significant digits.
  REQUIRE(p->entries.size() == 3);
  CHECK(p->entries[0].workload.op == "contrastive_loss");
  CHECK(p->entries[1].workload.op == "linear");
  CHECK(p->entries[2].workload.op == "transformer_layer");
  CHECK(p->entries[1].points[0].ms == 1.23457);
  CHECK(p->entries[2].points[1].ms == 31.0);
  CHECK(p->entries[0].points[0].spread == 0.02);
  CHECK(p->entries[0].workload.dims["temperature"] == 0.07);
  CHECK(p->entries[2].param_bytes == 39362560);
  CHECK(p->device == "A800-SXM4-80GB");
  CHECK(p->source == "analytic");
  CHECK(p->sha256.size() == 64);
  // The found entry is the one with the same key.
  CHECK(p->find(sample().entries[0].workload) == &p->entries[2]);
  Workload other = sample().entries[0].workload;
  other.batch = 128;
  CHECK(p->find(other) == nullptr);
}

TEST_CASE("profile readers accept x and x-* extension keys") {
  const std::string text = R"({"format": "spindle-profile", "version": 1, "device": "d",
    "source": "measured", "x-note": {"anything": 1},
    "entries": [{"op": "linear", "dims": {"in": 4, "out": 4}, "seq": 1, "batch": 2, "x": "why",
                 "points": [{"devices": 1, "ms": 2, "x-raw": [1, 2]}],
                 "param_bytes": 40, "activation_bytes_per_sample": 8}]})";
  auto p = parse_profile_string(text, "ext.json");
  REQUIRE(p.ok());
  CHECK(p->entries.at(0).points.at(0).ms == 2.0);
}

TEST_CASE("bad profiles are rejected naming the file and the key") {
  struct Case {
    const char* file;
    const char* key;
    const char* what;
  };
  const Case cases[] = {
      {"other-format.json", "format", "spindle-profile"},
      {"newer-version.json", "version", "newer"},
      {"unknown-key.json", "entries[1].points[1].devics", "unknown key"},
      {"non-increasing.json", "entries[1].points[2].devices", "strictly increasing"},
      {"nonpositive-ms.json", "entries[0].points[0].ms", "positive"},
      {"duplicate-entry.json", "entries[1]", "duplicate"},
  };
  for (const auto& c : cases) {
    INFO(c.file);
    auto p = load_profile(bad(c.file));
    REQUIRE_FALSE(p.ok());
    const std::string& msg = p.error().message;
    CHECK_THAT(msg, Catch::Contains(c.file));
    CHECK_THAT(msg, Catch::Contains(std::string(": ") + c.key + ": "));
    CHECK_THAT(msg, Catch::Contains(c.what));
  }
}

TEST_CASE("profile reader rejects malformed JSON, mixed sources without per-entry source") {
  auto a = parse_profile_string("{\"format\": ", "broken.json");
  REQUIRE_FALSE(a.ok());
  CHECK_THAT(a.error().message, Catch::Contains("broken.json"));
  const std::string mixed = R"({"format": "spindle-profile", "version": 1, "device": "d", "source": "mixed",
    "entries": [{"op": "linear", "dims": {"in": 4, "out": 4}, "seq": 1, "batch": 2,
                 "points": [{"devices": 1, "ms": 2}], "param_bytes": 40, "activation_bytes_per_sample": 8}]})";
  auto b = parse_profile_string(mixed, "mixed.json");
  REQUIRE_FALSE(b.ok());
  CHECK_THAT(b.error().message, Catch::Contains("entries[0].source"));
  auto c = load_profile(bad("does-not-exist.json"));
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(c.error().message, Catch::Contains("does-not-exist.json"));
}

TEST_CASE("version 3 comm_overhead round-trips, version 2 files have none, bad figures are rejected") {
  Profile p = sample();
  p.cluster = ProfileCluster{"a800-1x8", 8, 8};
  CommOverhead o;
  o.exchange_us = 5;
  o.message_us = 1.25;
  o.pack_gbytes_per_s = 1019.5;
  o.allreduce_us = 12.3456789;
  p.overhead = o;
  const std::string a = profile_to_json(p);
  CHECK_THAT(a, Catch::Contains("\"version\": 3"));
  auto q = parse_profile_string(a, "v3.json");
  REQUIRE(q.ok());
  REQUIRE(q->overhead.has_value());
  CHECK(q->overhead->exchange_us == 5.0);
  CHECK(q->overhead->message_us == 1.25);
  CHECK(q->overhead->pack_gbytes_per_s == 1019.5);
  CHECK(q->overhead->allreduce_us == 12.3457);   // 6 significant digits
  CHECK(profile_to_json(*q) == a);

  // Without overhead figures: version 2 (with a cluster), read back without any.
  p.overhead.reset();
  const std::string v2 = profile_to_json(p);
  CHECK_THAT(v2, Catch::Contains("\"version\": 2"));
  auto r = parse_profile_string(v2, "v2.json");
  REQUIRE(r.ok());
  CHECK_FALSE(r->overhead.has_value());

  // Version 3 requires the object; each figure >= 0.
  std::string missing = a;
  const size_t at = missing.find("  \"comm_overhead\"");
  missing.erase(at, missing.find('\n', at) + 1 - at);
  auto m = parse_profile_string(missing, "v3.json");
  REQUIRE_FALSE(m.ok());
  CHECK_THAT(m.error().message, Catch::Contains("comm_overhead: missing required key"));
  CHECK_THAT(refused(a, "\"exchange_us\":5", "\"exchange_us\":-5"), Catch::Contains("comm_overhead.exchange_us"));

  // The executor's figures (measured only): absent, 0 and not written;
  // else written, read back, and checked like the others.
  CHECK(q->overhead->instruction_us == 0);
  CHECK(q->overhead->accumulate_gbytes_per_s == 0);
  CHECK(a.find("instruction_us") == std::string::npos);
  o.instruction_us = 0.61;
  o.accumulate_gbytes_per_s = 9.75;
  p.overhead = o;
  const std::string measured = profile_to_json(p);
  auto back = parse_profile_string(measured, "v3.json");
  REQUIRE(back.ok());
  CHECK(back->overhead->instruction_us == 0.61);
  CHECK(back->overhead->accumulate_gbytes_per_s == 9.75);
  CHECK(profile_to_json(*back) == measured);
  CHECK_THAT(refused(measured, "\"accumulate_gbytes_per_s\":9.75", "\"accumulate_gbytes_per_s\":\"fast\""),
             Catch::Contains("comm_overhead.accumulate_gbytes_per_s: expected a number"));
  CHECK_THAT(refused(measured, "\"instruction_us\":0.61", "\"instruction_us\":-1"),
             Catch::Contains("comm_overhead.instruction_us: expected a number from 0"));
  // ZeRO-1's fixed costs: absent (allreduce_us's), not written; set (0
  // included: a figure, not the all-reduce's), written and read back.
  CHECK_FALSE(back->overhead->reduce_scatter_us.has_value());
  CHECK_FALSE(back->overhead->allgather_us.has_value());
  CHECK(measured.find("reduce_scatter_us") == std::string::npos);
  o.reduce_scatter_us = 56.4;
  o.allgather_us = 0;
  p.overhead = o;
  const std::string zero1 = profile_to_json(p);
  auto z = parse_profile_string(zero1, "v3.json");
  REQUIRE(z.ok());
  CHECK(z->overhead->reduce_scatter_us == 56.4);
  CHECK(z->overhead->allgather_us == 0.0);
  CHECK(profile_to_json(*z) == zero1);
  for (const std::string bad : {"-1", "2e9", "\"slow\""})
    CHECK_THAT(refused(zero1, "\"reduce_scatter_us\":56.4", "\"reduce_scatter_us\":" + bad),
               Catch::Contains("v3.json") && Catch::Contains("comm_overhead.reduce_scatter_us"));
  o.reduce_scatter_us.reset();
  o.allgather_us.reset();
  p.overhead = o;
  // A rate other than 0 below kMinRate would price a copy at ~10^300 ms: refused.
  for (const std::string key : {"accumulate_gbytes_per_s", "pack_gbytes_per_s"}) {
    std::string tiny = measured;
    const size_t pos = tiny.find("\"" + key + "\":");
    REQUIRE(pos != std::string::npos);
    tiny.insert(pos + key.size() + 3, "1e-300,\"x-was\":");
    auto t = parse_profile_string(tiny, "v3.json");
    REQUIRE_FALSE(t.ok());
    CHECK_THAT(t.error().message, Catch::Contains("comm_overhead." + key + ": expected 0 or a rate from 0.001"));
  }
}

TEST_CASE("x-forward_share: written when known, read back, absent means unknown, checked") {
  Profile p = sample();
  p.entries[0].forward_share = 0.29;   // the layer
  const std::string bytes = profile_to_json(p);
  CHECK(bytes.find("\"x-forward_share\":0.29") != std::string::npos);
  CHECK(bytes.find("x-forward_share") == bytes.rfind("x-forward_share"));   // only the one entry that has it
  auto back = parse_profile_string(bytes, "p.json");
  REQUIRE(back.ok());
  int known = 0;
  for (const ProfileEntry& e : back->entries) {
    if (e.workload.op == "transformer_layer") CHECK(e.forward_share == 0.29);
    else CHECK(e.forward_share == -1);
    known += e.forward_share >= 0;
  }
  CHECK(known == 1);
  CHECK(profile_to_json(*back) == bytes);
  for (const char* bad_value : {"1.5", "-0.1", "\"half\""}) {
    std::string text = bytes;
    const size_t at = text.find("0.29");
    text.replace(at, 4, bad_value);
    auto r = parse_profile_string(text, "p.json");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("p.json") && Catch::Contains("x-forward_share") &&
                                      Catch::Contains("[0, 1]"));
  }
}

TEST_CASE("x-optimizer: the optimizer step's rate round-trips, absent means unpriced, bad figures are rejected") {
  check_one_figure(&Profile::optimizer_gbytes_per_s, "x-optimizer", "gbytes_per_s", 12.3456789, "12.3457",
                   {"0", "-1", "2e9", "\"fast\""});
}

TEST_CASE("x-compute: the operators' in-step scale round-trips, absent means 1, bad figures are rejected") {
  check_one_figure(&Profile::compute_scale, "x-compute", "in_step_scale", 1.123456789, "1.12346",
                   {"0", "0.2", "4.5", "-1", "\"slow\""});
}

TEST_CASE("x-links progress: calls round-trips, absent means background, another value is refused") {
  Profile p = sample();
  p.cluster = ProfileCluster{"c", 2, 2};
  ProfileLinks links;
  links.ranks = 2;
  p.links = links;
  const std::string background = profile_to_json(p);
  CHECK(background.find("progress") == std::string::npos);
  CHECK_FALSE(parse_profile_string(background, "p.json")->links->progress_in_calls);
  p.links->progress_in_calls = true;
  const std::string calls = profile_to_json(p);
  CHECK(calls.find("\"progress\":\"calls\"") != std::string::npos);
  auto back = parse_profile_string(calls, "p.json");
  REQUIRE(back.ok());
  CHECK(back->links->progress_in_calls);
  CHECK(profile_to_json(*back) == calls);
  std::string text = calls;
  text.replace(text.find("\"calls\""), 7, "\"often\"");
  auto r = parse_profile_string(text, "p.json");
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("p.json") && Catch::Contains("x-links.progress"));
}
