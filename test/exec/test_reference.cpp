// transformer_layer and contrastive_loss against an independent reference:
// test/data/reference/attention.json, written by attention.py beside it
// (NumPy, float64, from the definitions in docs/spec/ops.md; gradients by
// finite differences of that forward). Inputs and parameters are the same
// float32 numbers on both sides; the C++ ops compute in fp32.
//
// Tolerance per tensor: |cpp - ref| <= 1e-5 * max(1, max |ref|) for every
// element of the output, and 1e-4 * max(1e-2, max |ref|) for every element
// of each gradient (fp32 rounding of a 12-wide layer is about 1e-6; a wrong
// scale, mask, head layout or epsilon is far outside).
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "libexec/ops/op.h"

using namespace spindle::exec;

namespace {

nlohmann::json read_reference() {
  const std::string path = std::string(SPINDLE_TEST_DATA) + "/reference/attention.json";
  std::ifstream in(path);
  REQUIRE(in.good());
  nlohmann::json j = nlohmann::json::parse(in);
  REQUIRE(j.at("format") == "spindle-op-reference");
  return j;
}

Tensor to_tensor(const nlohmann::json& t) {
  Shape shape = t.at("shape").get<Shape>();
  const std::vector<float> values = t.at("values").get<std::vector<float>>();
  REQUIRE(static_cast<int64_t>(values.size()) == shape_numel(shape));
  return Tensor::from(std::move(shape), values);
}

// Largest |got - ref| over max(floor, max |ref|); shapes must agree.
double rel_error(const Tensor& got, const nlohmann::json& ref, double floor) {
  const Tensor r = to_tensor(ref);
  REQUIRE(got.numel() == r.numel());
  double diff = 0, scale = floor;
  for (int64_t i = 0; i < r.numel(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - r[i]));
    scale = std::max(scale, std::abs(static_cast<double>(r[i])));
  }
  return diff / scale;
}

// Runs one case of the fixture: forward, backward with its grad_output,
// every output, input gradient and parameter gradient against the file.
void check_case(const nlohmann::json& c) {
  OpConfig cfg;
  cfg.kind = op_kind(c.at("op").get<std::string>()).value();
  cfg.dims = c.at("dims");
  ParamSet params = make_params(cfg, "ref/0.0", 1);
  REQUIRE(params.params.size() == c.at("params").size());
  for (Param& p : params.params) {
    const std::string tensor = p.name.substr(p.name.rfind('/') + 1);
    INFO("parameter " << tensor);
    const Tensor v = to_tensor(c.at("params").at(tensor));
    REQUIRE(v.shape() == p.value.shape());
    p.value = v;
  }
  Op op = make_op(cfg, params);
  std::vector<Tensor> in;
  for (const auto& t : c.at("inputs")) in.push_back(to_tensor(t));
  const Tensor out = op_forward(op, in);
  CHECK(out.shape() == c.at("output").at("shape").get<Shape>());
  CHECK(rel_error(out, c.at("output"), 1.0) <= 1e-5);
  params.zero_grads();
  const std::vector<Tensor> grads = op_backward(op, to_tensor(c.at("grad_output")));
  REQUIRE(grads.size() == c.at("input_grads").size());
  for (size_t i = 0; i < grads.size(); ++i) {
    INFO("input gradient " << i);
    CHECK(rel_error(grads[i], c.at("input_grads")[i], 1e-2) <= 1e-4);
  }
  for (Param& p : params.params) {
    const std::string tensor = p.name.substr(p.name.rfind('/') + 1);
    INFO("parameter gradient " << tensor);
    CHECK(rel_error(p.grad, c.at("param_grads").at(tensor), 1e-2) <= 1e-4);
  }
}

const nlohmann::json& find_case(const nlohmann::json& ref, const std::string& op, bool causal) {
  for (const auto& c : ref.at("cases"))
    if (c.at("op") == op && c.at("dims").value("causal", false) == causal) return c;
  FAIL("no case " << op << " in the fixture");
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("reference: transformer_layer forward and backward equal NumPy's (not causal)", "[reference]") {
  check_case(find_case(read_reference(), "transformer_layer", false));
}

TEST_CASE("reference: transformer_layer forward and backward equal NumPy's (causal)", "[reference]") {
  check_case(find_case(read_reference(), "transformer_layer", true));
}

TEST_CASE("reference: contrastive_loss forward and backward equal NumPy's, default and given temperature",
          "[reference]") {
  const nlohmann::json ref = read_reference();
  int n = 0;
  for (const auto& c : ref.at("cases"))
    if (c.at("op") == "contrastive_loss") {
      INFO("dims " << c.at("dims").dump());
      check_case(c);
      ++n;
    }
  CHECK(n == 2);
}
