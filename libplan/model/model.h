// The model description (spec/model.md), parsed and validated.
//
// A Model is plain data: modules (stacks of blocks) and tasks (small DAGs of
// module instances). parse_model_string (and load_model) fill in every
// default, so downstream code never looks at optional keys again.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "libplan/util/status.h"

namespace spindle::plan {

enum class DType { bf16, fp16, fp32 };
int dtype_bytes(DType t);             // 2, 2, 4
const char* dtype_name(DType t);      // "bf16", ...

// Position of a key in the YAML file (1-based; 0 = unknown).
struct Mark {
  int line = 0;
  int column = 0;
};

// One block of a module: `repeat` identical consecutive operators.
struct Block {
  std::string op;          // catalogue name (libplan/model/ops.h)
  int repeat = 1;
  // The op's dimensions with defaults filled in, as a JSON object with sorted
  // keys: ints for sizes, bool for `causal`, double for `temperature`.
  // Exactly what the profile and the plan write as "dims".
  nlohmann::json dims;
  Mark mark;

  int64_t dim(const char* name) const;   // integer dimension; asserts presence
};

struct Module {
  std::string name;
  std::vector<Block> blocks;
  int tensor_parallel = 1;
  int64_t max_seq = 0;      // S: largest seq with which the module is used anywhere
  Mark mark;

  bool reads_data() const;  // first block is patch_embed or token_embed
  bool is_loss() const;     // last block is contrastive_loss or lm_loss
  int64_t in_width() const;   // width of the module's input (0 for data readers)
  int64_t out_width() const;  // width of its output (0 for a loss)
  bool pools() const;         // contains a pool_project: output seq is 1
};

struct Node {
  std::string id;
  std::string module;
  int64_t seq = 0;            // input sequence length (given or derived)
  std::vector<std::string> inputs;
  Mark mark;
};

struct Task {
  std::string name;
  int64_t batch = 0;          // global samples per iteration
  double weight = 1.0;
  std::vector<Node> nodes;    // in file order; inputs always refer to earlier nodes
  Mark mark;
};

struct Model {
  std::string name;
  DType dtype = DType::bf16;
  std::vector<Module> modules;   // in file order
  std::vector<Task> tasks;       // in file order
  std::string path;              // file it was read from ("" when parsed from a string)
  std::string sha256;            // hex SHA-256 of the file's bytes

  const Module* find_module(const std::string& name) const;
  int64_t parameter_count() const;  // all modules, each parameter once
};

// Parses and validates a model description. `path` is used in messages and
// recorded in Model::path. On error returns a message naming the file, key
// path, line and column (spec/README.md), e.g. an unknown op, unknown key,
// missing or unknown input, cycle, seq or width mismatch, contrastive_loss
// without two pooled inputs, a task without a loss, non-positive batch.
Result<Model> parse_model_string(const std::string& yaml_text, const std::string& path);
Result<Model> load_model(const std::string& path);

}  // namespace spindle::plan
