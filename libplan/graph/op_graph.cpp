// Expansion of a validated model into its operator graph (spec/model.md,
// "Operator graph"; ids per spec/plan.md).
#include "libplan/graph/op_graph.h"

#include "libplan/model/ops.h"

#include <algorithm>
#include <map>

namespace spindle::plan {

namespace {

// A string json::dump() writes as it is, between quotes: printable ASCII
// without '"' or '\\'.
bool plain_json_string(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; });
}

}  // namespace

std::string Workload::key() const {
  // The bytes of dims.dump() for a flat object (the only dims a reader
  // accepts), built without recursing: a nested value would be written "?".
  // Catalogue names, integers and booleans (every dims a reader accepts but
  // `temperature`) are written here as dump() writes them; anything else
  // goes through dump(). Called once per operator by planning: kept cheap.
  std::string k = op;
  k += '{';
  if (dims.is_object()) {
    bool first = true;
    for (const auto& [name, value] : dims.items()) {
      if (!first) k += ',';
      first = false;
      if (plain_json_string(name)) {
        k += '"';
        k += name;
        k += '"';
      } else {
        k += nlohmann::json(name).dump();
      }
      k += ':';
      if (value.is_structured())
        k += '?';
      else if (value.is_number_integer())
        k += value.is_number_unsigned() ? std::to_string(value.get<uint64_t>()) : std::to_string(value.get<int64_t>());
      else if (value.is_boolean())
        k += value.get<bool>() ? "true" : "false";
      else
        k += value.dump();
    }
  }
  k += "}/s";
  k += std::to_string(seq);
  k += "/b";
  k += std::to_string(batch);
  return k;
}

OpGraph expand(const Model& model) {
  OpGraph g;
  for (std::size_t t = 0; t < model.tasks.size(); ++t) {
    const Task& task = model.tasks[t];
    // Index of the first and last operator of every node of this task.
    std::map<std::string, std::pair<int, int>> span;
    for (std::size_t n = 0; n < task.nodes.size(); ++n) {
      const Node& node = task.nodes[n];
      const Module* m = model.find_module(node.module);
      if (m == nullptr) continue;  // not reachable for a validated model
      const int first = static_cast<int>(g.ops.size());
      int64_t seq = node.seq;  // input seq of the next operator
      for (std::size_t k = 0; k < m->blocks.size(); ++k) {
        const Block& b = m->blocks[k];
        const int64_t op_seq = op_needs_whole_batch(b.op) ? 1 : seq;  // embeddings of one token
        for (int rep = 0; rep < b.repeat; ++rep) {
          Operator op;
          const std::string kr = std::to_string(k) + "." + std::to_string(rep);
          op.id = task.name + "/" + node.id + "/" + kr;
          op.param = m->name + "/" + kr;
          op.task = static_cast<int>(t);
          op.node = static_cast<int>(n);
          op.block = static_cast<int>(k);
          op.rep = rep;
          op.tensor_parallel = m->tensor_parallel;
          op.workload = Workload{b.op, b.dims, op_seq, task.batch};
          const int self = static_cast<int>(g.ops.size());
          if (self > first) {
            op.inputs.push_back(self - 1);
            g.ops[self - 1].outputs.push_back(self);
          }
          g.ops.push_back(std::move(op));
        }
        seq = op_out_seq(b.op, seq);
      }
      const int last = static_cast<int>(g.ops.size()) - 1;
      if (last < first) continue;  // a module without blocks: rejected by the parser
      span[node.id] = {first, last};
      // Edges from each input node's last operator to this node's first.
      std::vector<int>& ins = g.ops[first].inputs;
      for (const std::string& in : node.inputs) {
        auto it = span.find(in);
        if (it == span.end()) continue;  // not reachable for a validated model
        const int src = it->second.second;
        ins.push_back(src);
        g.ops[src].outputs.push_back(first);
      }
      std::sort(ins.begin(), ins.end());
      ins.erase(std::unique(ins.begin(), ins.end()), ins.end());
    }
  }
  // Sources' output lists were appended in increasing consumer order, except
  // that chain edges and input edges interleave; sort to honour the header.
  for (Operator& op : g.ops) {
    std::sort(op.outputs.begin(), op.outputs.end());
    op.outputs.erase(std::unique(op.outputs.begin(), op.outputs.end()), op.outputs.end());
  }
  return g;
}

Status check_profile_keys(const Model& model, const OpGraph& graph) {
  std::map<std::string, const Operator*> first;   // by Workload::key()
  for (const Operator& op : graph.ops) {
    const auto [it, fresh] = first.emplace(op.workload.key(), &op);
    if (fresh || it->second->tensor_parallel == op.tensor_parallel) continue;
    // The modules and the block's place in the file, where the graph is the
    // model's (a graph built by hand may name none).
    const auto module_of = [&](const Operator& o) -> const Module* {
      if (o.task < 0 || static_cast<size_t>(o.task) >= model.tasks.size()) return nullptr;
      const Task& t = model.tasks[static_cast<size_t>(o.task)];
      if (o.node < 0 || static_cast<size_t>(o.node) >= t.nodes.size()) return nullptr;
      return model.find_module(t.nodes[static_cast<size_t>(o.node)].module);
    };
    const auto describe = [&](const Operator& o, const Module* m) {
      return "operator " + o.id + " (" + (m ? "module '" + m->name + "', " : std::string()) + "tensor_parallel " +
             std::to_string(o.tensor_parallel) + ")";
    };
    const Module* a = module_of(*it->second);
    const Module* b = module_of(op);
    Where where{model.path.empty() ? "<model>" : model.path, "", 0, 0};
    if (b != nullptr && static_cast<size_t>(op.block) < b->blocks.size()) {
      const Mark at = b->blocks[static_cast<size_t>(op.block)].mark;
      where = Where{where.file, "modules." + b->name, at.line, at.column};
    }
    return make_error(where, describe(op, b) + " has the workload of " + describe(*it->second, a) + ": " +
                                 op.workload.key() +
                                 "; a profile keys one curve per workload, so both modules need the same "
                                 "tensor_parallel, or the blocks other dimensions (or the nodes another seq)");
  }
  return Status::Ok();
}

}  // namespace spindle::plan
