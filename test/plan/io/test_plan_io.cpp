// Plan JSON reader/writer and the plan checker (spec/plan.md).
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "test/plan/shipped_fixture.h"
#include "libplan/lower/lower.h"
#include "libplan/plan/check.h"
#include "libplan/plan/plan_io.h"
#include "libplan/planner/planner.h"

namespace sp = spindle::plan;

using spindle::plan::testing::Fixture;

namespace {

// The error of reading plan `d` (as "p.json"), which must be refused.
std::string error_of(const nlohmann::json& d) {
  auto r = sp::parse_plan_string(d.dump(), "p.json");
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

}  // namespace

TEST_CASE("plan JSON: encode, decode, encode gives the same bytes", "[plan_io]") {
  Fixture f;
  for (sp::Strategy s : {sp::Strategy::spindle, sp::Strategy::sequential}) {
    const std::string a = sp::plan_to_json(f.plan(s));
    auto decoded = sp::parse_plan_string(a, "a.json");
    REQUIRE(decoded.ok());
    CHECK(sp::plan_to_json(*decoded) == a);
    CHECK(sp::check_plan(*decoded, f.model, f.graph).empty());
  }
}

TEST_CASE("plan JSON: two plannings of the same inputs give the same bytes", "[plan_io]") {
  Fixture f("multitask-clip-10", "a800-4x8");
  CHECK(sp::plan_to_json(f.plan()) == sp::plan_to_json(f.plan()));
}

TEST_CASE("plan JSON: other formats, newer versions, unknown keys are rejected", "[plan_io]") {
  Fixture f;
  nlohmann::json doc = nlohmann::json::parse(sp::plan_to_json(f.plan()));

  nlohmann::json d = doc;
  d["format"] = "spindle-profile";
  CHECK_THAT(error_of(d), Catch::Contains("p.json") && Catch::Contains("format") &&
                              Catch::Contains("spindle-plan"));
  d = doc;
  d["version"] = 2;
  CHECK_THAT(error_of(d), Catch::Contains("version") && Catch::Contains("newer") && Catch::Contains("upgrade"));
  d = doc;
  d["waves"][0]["colour"] = "red";
  CHECK_THAT(error_of(d), Catch::Contains("waves[0].colour") && Catch::Contains("unknown key"));
  d = doc;
  d["waves"][0]["slices"][0].erase("devices");
  CHECK_THAT(error_of(d), Catch::Contains("waves[0].slices[0]") && Catch::Contains("devices"));
  d = doc;
  d["metaops"][0]["level"] = "one";
  CHECK_THAT(error_of(d), Catch::Contains("metaops[0].level") && Catch::Contains("integer"));
  d = doc;
  d["strategy"] = "";   // a plan of no strategy passed as "valid  plan"
  CHECK_THAT(error_of(d), Catch::Contains("p.json: strategy: expected a name"));
  d = doc;
  d["x-note"] = "extensions are allowed";
  CHECK(sp::parse_plan_string(d.dump(), "p.json").ok());
  CHECK_FALSE(sp::parse_plan_string("{\"format\": ", "p.json").ok());
}


TEST_CASE("plan JSON: predicted.simulated_ms is written, read back, optional, and checked", "[plan_io]") {
  Fixture f;
  const sp::Plan plan = f.plan();
  REQUIRE(plan.predicted.simulated_ms > 0);   // the planner's objective, always simulated
  nlohmann::json doc = nlohmann::json::parse(sp::plan_to_json(plan));
  CHECK(doc["predicted"]["simulated_ms"].get<double>() == Approx(plan.predicted.simulated_ms).margin(5e-4));  // 3 decimals
  auto back = sp::parse_plan_string(doc.dump(), "p.json");
  REQUIRE(back.ok());
  CHECK(back->predicted.simulated_ms == doc["predicted"]["simulated_ms"].get<double>());
  // A plan without it (written before the field existed) reads as not simulated.
  nlohmann::json old = doc;
  old["predicted"].erase("simulated_ms");
  auto older = sp::parse_plan_string(old.dump(), "p.json");
  REQUIRE(older.ok());
  CHECK(older->predicted.simulated_ms == 0);
  CHECK(sp::plan_to_json(*older).find("simulated_ms") == std::string::npos);
  // Negative, non-numeric: refused, naming the key.
  for (const nlohmann::json& bad : {nlohmann::json(-1.0), nlohmann::json("fast")}) {
    nlohmann::json d = doc;
    d["predicted"]["simulated_ms"] = bad;
    CHECK_THAT(error_of(d), Catch::Contains("p.json") && Catch::Contains("predicted.simulated_ms"));
  }
}

TEST_CASE("plan JSON: x-lowering.bucket_starts is written when ready, read back, optional, and checked", "[plan_io]") {
  Fixture f;
  sp::Plan plan = f.plan();
  plan.bucket_starts = sp::BucketStarts::in_order;
  const std::string in_order = sp::plan_to_json(plan);
  CHECK(in_order.find("x-lowering") == std::string::npos);   // the default: the key is absent
  plan.bucket_starts = sp::BucketStarts::when_ready;
  const std::string when_ready = sp::plan_to_json(plan);
  nlohmann::json doc = nlohmann::json::parse(when_ready);
  CHECK(doc["x-lowering"] == nlohmann::json{{"bucket_starts", "when-ready"}});
  auto back = sp::parse_plan_string(when_ready, "p.json");
  REQUIRE(back.ok());
  CHECK(back->bucket_starts == sp::BucketStarts::when_ready);
  CHECK(sp::plan_to_json(*back) == when_ready);
  auto absent = sp::parse_plan_string(in_order, "p.json");
  REQUIRE(absent.ok());
  CHECK(absent->bucket_starts == sp::BucketStarts::in_order);
  nlohmann::json named = doc;
  named["x-lowering"]["bucket_starts"] = "in-order";
  auto spelled_out = sp::parse_plan_string(named.dump(), "p.json");
  REQUIRE(spelled_out.ok());
  CHECK(spelled_out->bucket_starts == sp::BucketStarts::in_order);
  // Another value, another type, an unknown key under it: refused, naming the key.
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"bucket_starts", "eager"}, {"bucket_starts", 1}, {"bucket_start", "when-ready"}}) {
    nlohmann::json d = doc;
    d["x-lowering"] = {{key, value}};
    CHECK_THAT(error_of(d), Catch::Contains("p.json") && Catch::Contains("x-lowering." + key));
  }
}

TEST_CASE("plan JSON: x-memory.optimizer_state is written when replicated, read back, optional, and checked",
          "[plan_io]") {
  Fixture f;
  sp::Plan plan = f.plan();
  plan.optimizer_state = sp::OptimizerState::sharded;
  const std::string sharded = sp::plan_to_json(plan);
  CHECK(sharded.find("x-memory") == std::string::npos);   // the default: absent
  plan.optimizer_state = sp::OptimizerState::replicated;
  const std::string replicated = sp::plan_to_json(plan);
  nlohmann::json doc = nlohmann::json::parse(replicated);
  CHECK(doc["x-memory"] == nlohmann::json{{"optimizer_state", "replicated"}});
  auto back = sp::parse_plan_string(replicated, "p.json");
  REQUIRE(back.ok());
  CHECK(back->optimizer_state == sp::OptimizerState::replicated);
  CHECK(sp::plan_to_json(*back) == replicated);
  auto absent = sp::parse_plan_string(sharded, "p.json");
  REQUIRE(absent.ok());
  CHECK(absent->optimizer_state == sp::OptimizerState::sharded);
  nlohmann::json named = doc;
  named["x-memory"]["optimizer_state"] = "sharded";
  auto spelled_out = sp::parse_plan_string(named.dump(), "p.json");
  REQUIRE(spelled_out.ok());
  CHECK(spelled_out->optimizer_state == sp::OptimizerState::sharded);
  // Another value, another type, an unknown key under it, not an object:
  // refused, naming the file and the key.
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"optimizer_state", "zero1"}, {"optimizer_state", true}, {"optimizer", "replicated"}}) {
    nlohmann::json d = doc;
    d["x-memory"] = {{key, value}};
    CHECK_THAT(error_of(d), Catch::Contains("p.json") && Catch::Contains("x-memory." + key));
  }
  nlohmann::json d = doc;
  d["x-memory"] = "replicated";
  CHECK_THAT(error_of(d), Catch::Contains("x-memory"));
}

TEST_CASE("plan JSON: x-lowering.early_transfers is written when false, read back, optional, and checked", "[plan_io]") {
  Fixture f;
  sp::Plan plan = f.plan();
  plan.early_transfers = true;
  plan.bucket_starts = sp::BucketStarts::in_order;
  CHECK(sp::plan_to_json(plan).find("x-lowering") == std::string::npos);   // the default: absent
  plan.early_transfers = false;
  plan.bucket_starts = sp::BucketStarts::when_ready;
  const std::string both = sp::plan_to_json(plan);
  nlohmann::json doc = nlohmann::json::parse(both);
  CHECK(doc["x-lowering"] == nlohmann::json{{"bucket_starts", "when-ready"}, {"early_transfers", false}});
  auto back = sp::parse_plan_string(both, "p.json");
  REQUIRE(back.ok());
  CHECK_FALSE(back->early_transfers);
  CHECK(back->bucket_starts == sp::BucketStarts::when_ready);
  CHECK(sp::plan_to_json(*back) == both);
  nlohmann::json spelled = doc;
  spelled["x-lowering"]["early_transfers"] = true;
  auto early = sp::parse_plan_string(spelled.dump(), "p.json");
  REQUIRE(early.ok());
  CHECK(early->early_transfers);
  for (const nlohmann::json& bad : {nlohmann::json("no"), nlohmann::json(0)}) {
    nlohmann::json d = doc;
    d["x-lowering"]["early_transfers"] = bad;
    CHECK_THAT(error_of(d), Catch::Contains("p.json") && Catch::Contains("x-lowering.early_transfers"));
  }
}

TEST_CASE("plan JSON: x-lowering.param_gather is written when next-step, read back, optional, and checked", "[plan_io]") {
  Fixture f;
  sp::Plan plan = f.plan();
  CHECK(plan.param_gather == sp::ParamGather::after_step);   // the default, as plans before the choice lower
  CHECK(sp::plan_to_json(plan).find("param_gather") == std::string::npos);
  plan.param_gather = sp::ParamGather::next_step;
  const std::string text = sp::plan_to_json(plan);
  nlohmann::json doc = nlohmann::json::parse(text);
  CHECK(doc["x-lowering"] == nlohmann::json{{"param_gather", "next-step"}});
  auto back = sp::parse_plan_string(text, "p.json");
  REQUIRE(back.ok());
  CHECK(back->param_gather == sp::ParamGather::next_step);
  CHECK(sp::plan_to_json(*back) == text);
  nlohmann::json spelled = doc;
  spelled["x-lowering"]["param_gather"] = "after-step";
  auto after = sp::parse_plan_string(spelled.dump(), "p.json");
  REQUIRE(after.ok());
  CHECK(after->param_gather == sp::ParamGather::after_step);
  for (const nlohmann::json& bad : {nlohmann::json("early"), nlohmann::json(true), nlohmann::json("next_step")}) {
    nlohmann::json d = doc;
    d["x-lowering"]["param_gather"] = bad;
    CHECK_THAT(error_of(d), Catch::Contains("p.json") && Catch::Contains("x-lowering.param_gather"));
  }
}

TEST_CASE("plan JSON: x-lowering.overlap and bucket_bytes are written when not the defaults, read back, and checked",
          "[plan_io]") {
  Fixture f;
  sp::Plan plan = f.plan();
  CHECK(plan.overlap);
  CHECK(plan.bucket_bytes == sp::kDefaultBucketBytes);
  CHECK(sp::plan_to_json(plan).find("x-lowering") == std::string::npos);   // the defaults: absent
  plan.overlap = false;
  plan.bucket_bytes = 10485;   // --bucket-mb 0.01
  const std::string text = sp::plan_to_json(plan);
  nlohmann::json doc = nlohmann::json::parse(text);
  CHECK(doc["x-lowering"] == nlohmann::json{{"overlap", false}, {"bucket_bytes", 10485}});
  auto back = sp::parse_plan_string(text, "p.json");
  REQUIRE(back.ok());
  CHECK_FALSE(back->overlap);
  CHECK(back->bucket_bytes == 10485);
  CHECK(sp::plan_to_json(*back) == text);
  // --bucket-mb's range in bytes: its ends pass, one byte beyond refused.
  for (int64_t ok : {sp::kMinBucketBytes, sp::kMaxBucketBytes, sp::bucket_bytes_of_mb(sp::kMinBucketMb),
                     sp::bucket_bytes_of_mb(sp::kMaxBucketMb)}) {
    nlohmann::json d = doc;
    d["x-lowering"]["bucket_bytes"] = ok;
    auto r = sp::parse_plan_string(d.dump(), "p.json");
    REQUIRE(r.ok());
    CHECK(r->bucket_bytes == ok);
  }
  for (const nlohmann::json& bad : {nlohmann::json(sp::kMinBucketBytes - 1), nlohmann::json(sp::kMaxBucketBytes + 1),
                                    nlohmann::json(0), nlohmann::json(-5), nlohmann::json(1.5), nlohmann::json("25")}) {
    nlohmann::json d = doc;
    d["x-lowering"]["bucket_bytes"] = bad;
    CHECK_THAT(error_of(d), Catch::Contains("p.json") && Catch::Contains("x-lowering.bucket_bytes"));
  }
  nlohmann::json d = doc;
  d["x-lowering"]["overlap"] = "no";
  CHECK_THAT(error_of(d), Catch::Contains("x-lowering.overlap"));
}

TEST_CASE("plan JSON: x-lowering.grad_norm is written when true, read back, and checked", "[plan_io]") {
  Fixture f;
  sp::Plan plan = f.plan();
  CHECK_FALSE(plan.grad_norm);
  plan.grad_norm = true;   // spindle-plan --grad-norm
  const std::string text = sp::plan_to_json(plan);
  const nlohmann::json doc = nlohmann::json::parse(text);
  CHECK(doc["x-lowering"] == nlohmann::json{{"grad_norm", true}});
  auto back = sp::parse_plan_string(text, "p.json");
  REQUIRE(back.ok());
  CHECK(back->grad_norm);
  CHECK(sp::planned_sync(*back).grad_norm);
  CHECK(sp::plan_to_json(*back) == text);
  nlohmann::json off = doc;
  off["x-lowering"]["grad_norm"] = false;   // written by hand: the default
  auto r = sp::parse_plan_string(off.dump(), "p.json");
  REQUIRE(r.ok());
  CHECK_FALSE(r->grad_norm);
  for (const nlohmann::json& bad : {nlohmann::json(1), nlohmann::json("true"), nlohmann::json(nullptr)}) {
    nlohmann::json d = doc;
    d["x-lowering"]["grad_norm"] = bad;
    CHECK_THAT(error_of(d), Catch::Contains("p.json") && Catch::Contains("x-lowering.grad_norm"));
  }
}
