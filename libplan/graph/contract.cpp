#include "libplan/graph/contract.h"

#include <algorithm>
#include <string>

namespace spindle::plan {

namespace {

// True when operator `j` (the consumer) continues the chain of operator `i`:
// the edge i->j is i's only out-edge and j's only in-edge, and both compute
// the same workload (equal Workload::key(), `key(op)`) on the same
// tensor-parallel degree.
template <class Key>
bool continues_chain(const OpGraph& graph, int i, int j, Key&& key) {
  const Operator& a = graph.ops[static_cast<size_t>(i)];
  const Operator& b = graph.ops[static_cast<size_t>(j)];
  return a.outputs.size() == 1 && a.outputs[0] == j && b.inputs.size() == 1 &&
         b.inputs[0] == i && a.tensor_parallel == b.tensor_parallel &&
         a.task == b.task && key(i) == key(j);
}

}  // namespace

Contraction contract(const OpGraph& graph) {
  Contraction out;
  const size_t n = graph.ops.size();
  // MetaOp of every operator. Operators are in topological order and every
  // edge goes from a lower to a higher index, so a single forward pass both
  // builds the chains and numbers MetaOps by their first operator, which is a
  // topological order of the MetaOps (an input MetaOp ends before its
  // consumer starts).
  std::vector<int> metaop_of(n, -1);
  // Workload keys, made at most once per operator (Workload::operator==
  // makes both keys on every comparison).
  std::vector<std::string> keys(n);
  std::vector<char> have_key(n, 0);
  auto key = [&](int o) -> const std::string& {
    const auto u = static_cast<size_t>(o);
    if (!have_key[u]) {
      keys[u] = graph.ops[u].workload.key();
      have_key[u] = 1;
    }
    return keys[u];
  };
  for (size_t k = 0; k < n; ++k) {
    const int i = static_cast<int>(k);
    const Operator& op = graph.ops[k];
    if (op.inputs.size() == 1 && continues_chain(graph, op.inputs[0], i, key)) {
      const int m = metaop_of[static_cast<size_t>(op.inputs[0])];
      metaop_of[k] = m;
      out.metaops[static_cast<size_t>(m)].operators.push_back(i);
      continue;
    }
    MetaOp meta;
    meta.id = static_cast<int>(out.metaops.size());
    meta.task = op.task;
    meta.workload = op.workload;
    meta.tensor_parallel = op.tensor_parallel;
    meta.operators.push_back(i);
    // Only a chain's first operator can have inputs from other MetaOps.
    for (int in : op.inputs) meta.inputs.push_back(metaop_of[static_cast<size_t>(in)]);
    std::sort(meta.inputs.begin(), meta.inputs.end());
    meta.inputs.erase(std::unique(meta.inputs.begin(), meta.inputs.end()), meta.inputs.end());
    // Longest-path depth: inputs have lower ids, so their levels are final.
    for (int in : meta.inputs)
      meta.level = std::max(meta.level, out.metaops[static_cast<size_t>(in)].level + 1);
    out.levels = std::max(out.levels, meta.level + 1);
    metaop_of[k] = meta.id;
    out.metaops.push_back(std::move(meta));
  }
  return out;
}

}  // namespace spindle::plan
