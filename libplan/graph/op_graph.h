// The operator graph (spec/model.md, "Operator graph"): one operator per block
// repetition of every node of every task, with the ids of spec/plan.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "libplan/model/model.h"

namespace spindle::plan {

// What an operator computes, as the profile keys it: (op, dims, seq, batch).
// Two operators with equal workloads cost the same.
struct Workload {
  std::string op;
  nlohmann::json dims;   // filled-in dims, sorted keys
  int64_t seq = 0;       // input sequence length of the operator
  int64_t batch = 0;     // the task's global batch

  // Canonical string key, e.g. `transformer_layer{"causal":false,...}/s257/b256`.
  std::string key() const;
  bool operator==(const Workload& o) const { return key() == o.key(); }
  bool operator<(const Workload& o) const { return key() < o.key(); }
};

struct Operator {
  std::string id;          // "T/N/k.r"
  std::string param;       // "M/k.r": parameters shared by every use of the module
  int task = 0;            // index into Model::tasks
  int node = 0;            // index into Task::nodes
  int block = 0;           // k
  int rep = 0;             // r
  int tensor_parallel = 1; // of the module
  Workload workload;
  std::vector<int> inputs;   // operator indices, ascending
  std::vector<int> outputs;  // operator indices, ascending
};

// Operators in a topological order: task by task, node by node in file order,
// block by block, repetition by repetition. Every edge goes from a lower to a
// higher index.
struct OpGraph {
  std::vector<Operator> ops;
};

// Expands a validated model. Cannot fail on a model that parse_model accepted.
OpGraph expand(const Model& model);

// A profile keys its entries by workload alone (spec/profile.md), and the
// times of K-way tensor-parallel groups are not those of data parallelism
// over the same devices: operators of one workload must come from modules
// of the same tensor_parallel. Else an error at the second module's block
// ("FILE:LINE:COL: modules.M: ..."), naming both operators and modules.
// Every path from a model to a plan or a profile asks it (analytic_profile,
// the planner's prepare), so a profile from a file cannot lend one curve
// to both.
Status check_profile_keys(const Model& model, const OpGraph& graph);

}  // namespace spindle::plan
