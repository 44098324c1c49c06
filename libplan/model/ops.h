// The operator catalogue of spec/model.md: names, dimensions, shapes and
// parameter counts. Shared by the parser (validation), the analytic profiler
// (FLOPs and bytes) and the runtime (shapes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace spindle::plan {

enum class DimKind { Int, Bool, Float };

struct DimSpec {
  const char* name;
  DimKind kind;
  bool required;
  nlohmann::json default_value;  // null when required
};

struct OpSpec {
  const char* name;
  std::vector<DimSpec> dims;
  bool reads_data;   // patch_embed, token_embed: no input activation
  bool is_loss;      // contrastive_loss, lm_loss: scalar output
};

// The whole catalogue, in a fixed order.
const std::vector<OpSpec>& op_catalogue();
// nullptr when `name` is not in the catalogue.
const OpSpec* find_op(const std::string& name);

// Empty when `dims` is exactly the filled-in dims of `spec` (every dimension
// of the catalogue and no other key, each of its kind: integers in
// 1..limits::kMaxSize, booleans, finite positive numbers); otherwise what is
// wrong, naming the dimension. Never recurses into a value, so it is safe on
// unvalidated input (profile and plan readers).
std::string op_dims_problem(const OpSpec& spec, const nlohmann::json& dims);

// Shapes and sizes of one operator given its filled-in dims.
// `max_seq` is S of the module (for position tables).
int64_t op_in_width(const std::string& op, const nlohmann::json& dims);   // 0 for data readers
int64_t op_out_width(const std::string& op, const nlohmann::json& dims);  // 0 for losses
int64_t op_param_count(const std::string& op, const nlohmann::json& dims, int64_t max_seq);

}  // namespace spindle::plan
