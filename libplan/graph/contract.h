// Contraction of the operator graph into MetaOps and MetaLevels
// (docs/planner.md, step 2-3).
#pragma once

#include <vector>

#include "libplan/graph/op_graph.h"

namespace spindle::plan {

struct MetaOp {
  int id = 0;
  int task = 0;                 // index into Model::tasks
  Workload workload;
  int tensor_parallel = 1;
  std::vector<int> operators;   // OpGraph indices, chain order
  std::vector<int> inputs;      // MetaOp ids, ascending
  int level = 0;                // 0 for MetaOps without inputs

  int length() const { return static_cast<int>(operators.size()); }
};

struct Contraction {
  std::vector<MetaOp> metaops;  // id == index, topological order
  int levels = 0;               // number of MetaLevels
};

// General rule, never by module name: operator i merges into j when the edge
// i->j is i's only out-edge and j's only in-edge and both have the same
// workload; repeated in topological order. Deterministic.
Contraction contract(const OpGraph& graph);

}  // namespace spindle::plan
