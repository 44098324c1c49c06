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

TEST_CASE("profile reader rejects malformed JSON, and sources mix only when every entry names its own") {
  auto a = parse_profile_string("{\"format\": ", "broken.json");
  REQUIRE_FALSE(a.ok());
  CHECK_THAT(a.error().message, Catch::Contains("broken.json"));
  auto c = load_profile(bad("does-not-exist.json"));
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(c.error().message, Catch::Contains("does-not-exist.json"));
  // docs/spec/profile.md: "a database may mix both only if each entry then
  // carries its own source". The file's source is analytic or measured.
  const auto mixed = [](const std::string& version, const std::string& file_source, const std::string& first,
                        const std::string& second) {
    auto entry = [](int in, const std::string& source) {
      return R"({"op": "linear", "dims": {"in": )" + std::to_string(in) +
             R"(, "out": 4}, "seq": 1, "batch": 2, "points": [{"devices": 1, "ms": 2}], "param_bytes": 40,
                "activation_bytes_per_sample": 8)" +
             (source.empty() ? "" : R"(, "source": ")" + source + "\"") + "}";
    };
    return R"({"format": "spindle-profile", "version": )" + version + R"(, "device": "d", "source": ")" +
           file_source + R"(", "entries": [)" + entry(4, first) + ", " + entry(8, second) + "]}";
  };
  auto both = parse_profile_string(mixed("1", "measured", "analytic", "measured"), "both.json");
  REQUIRE(both.ok());
  CHECK(both->source == "measured");
  CHECK(both->entries[0].source == "analytic");
  CHECK(both->entries[1].source == "measured");
  CHECK(profile_to_json(*parse_profile_string(profile_to_json(*both), "again.json")) == profile_to_json(*both));
  auto lacking = parse_profile_string(mixed("1", "measured", "analytic", ""), "lacking.json");
  REQUIRE_FALSE(lacking.ok());
  CHECK(lacking.error().message ==
        "lacking.json: entries[1].source: missing: entries[0] says \"analytic\", unlike the file's \"measured\", and "
        "a profile that mixes sources names the source of every entry");
  CHECK(parse_profile_string(mixed("1", "analytic", "analytic", ""), "same.json").ok());   // no mix
  auto v1_mixed = parse_profile_string(mixed("1", "mixed", "analytic", "measured"), "v1.json");
  REQUIRE_FALSE(v1_mixed.ok());
  CHECK_THAT(v1_mixed.error().message, Catch::Contains("v1.json: source: expected \"analytic\" or \"measured\""));
  // Files of the builds that wrote versions 2 and 3 said "mixed": read, and
  // written again as version 1 with the file's source "measured".
  auto legacy = parse_profile_string(mixed("3", "mixed", "analytic", "measured").insert(1, R"("cluster": {"name": "c",
      "devices": 2, "devices_per_island": 2}, "comm_overhead": {"exchange_us": 5, "message_us": 1, "allreduce_us": 5,
      "pack_gbytes_per_s": 5}, )"),
                                     "v3.json");
  REQUIRE(legacy.ok());
  const std::string rewritten = profile_to_json(*legacy);
  CHECK_THAT(rewritten, Catch::Contains("\"source\": \"measured\",\n  \"version\": 1,\n  \"x-cluster\":"));
  auto none = parse_profile_string(mixed("3", "mixed", "analytic", "").insert(1, R"("cluster": {"name": "c",
      "devices": 2, "devices_per_island": 2}, "comm_overhead": {"exchange_us": 5, "message_us": 1, "allreduce_us": 5,
      "pack_gbytes_per_s": 5}, )"),
                                   "v3.json");
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.error().message, Catch::Contains("entries[1].source: missing"));
}

namespace {

// `v1`, a version 1 file as spindle-profile writes it, as the builds of
// 2026-11 to 2026-12-07 wrote it: version 3, its extension keys
// x-cluster, x-comm_overhead and x-spread without the "x-".
std::string as_version_3(std::string v1) {
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"\"version\": 1", "\"version\": 3"},
                                 {"\"x-cluster\"", "\"cluster\""},
                                 {"\"x-comm_overhead\"", "\"comm_overhead\""},
                                 {"\"x-spread\"", "\"spread\""}})
    for (size_t at = v1.find(from); at != std::string::npos; at = v1.find(from, at + to.size()))
      v1.replace(at, from.size(), to);
  return v1;
}

}  // namespace

TEST_CASE("comm_overhead round-trips under x-comm_overhead in version 1, versions 2 and 3 read the same, bad figures "
          "are rejected") {
  Profile p = sample();
  p.cluster = ProfileCluster{"a800-1x8", 8, 8};
  CommOverhead o;
  o.exchange_us = 5;
  o.message_us = 1.25;
  o.pack_gbytes_per_s = 1019.5;
  o.allreduce_us = 12.3456789;
  p.overhead = o;
  const std::string a = profile_to_json(p);
  // The format the spec fixes, version 1; the additions as extension keys.
  CHECK_THAT(a, Catch::Contains("\"version\": 1,\n  \"x-cluster\": {\"devices\":8,\"devices_per_island\":8,"
                                "\"name\":\"a800-1x8\"},\n  \"x-comm_overhead\": {"));
  CHECK_THAT(a, Catch::Contains("{\"devices\":1,\"ms\":0.5,\"x-spread\":0.02}"));
  CHECK(a.find("\"cluster\"") == std::string::npos);
  CHECK(a.find("\"comm_overhead\"") == std::string::npos);
  CHECK(a.find("\"spread\"") == std::string::npos);
  auto q = parse_profile_string(a, "v1.json");
  REQUIRE(q.ok());
  REQUIRE(q->overhead.has_value());
  CHECK(q->overhead->exchange_us == 5.0);
  CHECK(q->overhead->message_us == 1.25);
  CHECK(q->overhead->pack_gbytes_per_s == 1019.5);
  CHECK(q->overhead->allreduce_us == 12.3457);   // 6 significant digits
  CHECK(q->cluster->name == "a800-1x8");
  CHECK(q->entries.size() == p.entries.size());
  CHECK(profile_to_json(*q) == a);

  // The same profile as a version 3 file of the earlier builds: the same
  // profile, written back as version 1.
  const std::string v3 = as_version_3(a);
  REQUIRE(v3 != a);
  auto q3 = parse_profile_string(v3, "v3.json");
  REQUIRE(q3.ok());
  CHECK(profile_to_json(*q3) == a);
  // The unprefixed keys belong to versions 2 and 3 only, the prefixed ones
  // are extensions there (skipped).
  std::string v1_plain = v3;
  v1_plain.replace(v1_plain.find("\"version\": 3"), 12, "\"version\": 1");
  auto plain = parse_profile_string(v1_plain, "v1.json");
  REQUIRE_FALSE(plain.ok());
  CHECK_THAT(plain.error().message, Catch::Contains("unknown key"));

  // Without overhead figures: nothing written, read back without any; a
  // version 2 file (cluster, no overhead) reads so too.
  p.overhead.reset();
  const std::string none = profile_to_json(p);
  CHECK(none.find("comm_overhead") == std::string::npos);
  auto r = parse_profile_string(none, "v1.json");
  REQUIRE(r.ok());
  CHECK_FALSE(r->overhead.has_value());
  std::string v2 = as_version_3(none);
  v2.replace(v2.find("\"version\": 3"), 12, "\"version\": 2");
  auto r2 = parse_profile_string(v2, "v2.json");
  REQUIRE(r2.ok());
  CHECK_FALSE(r2->overhead.has_value());
  CHECK(r2->cluster.has_value());
  CHECK(profile_to_json(*r2) == none);

  // Version 3 requires the object; each figure >= 0.
  std::string missing = v3;   // its last key: the comma before it goes too
  const size_t at = missing.find(",\n  \"comm_overhead\"");
  REQUIRE(at != std::string::npos);
  missing.erase(at, missing.find('\n', at + 2) - at);
  auto m = parse_profile_string(missing, "v3.json");
  REQUIRE_FALSE(m.ok());
  CHECK_THAT(m.error().message, Catch::Contains("comm_overhead: missing required key"));
  CHECK_THAT(refused(a, "\"exchange_us\":5", "\"exchange_us\":-5"), Catch::Contains("x-comm_overhead.exchange_us"));
  CHECK_THAT(refused(v3, "\"exchange_us\":5", "\"exchange_us\":-5"), Catch::Contains(": comm_overhead.exchange_us"));

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
