// Parser and validator of the model description (spec/model.md).
//
// Every rule of the spec is checked here, so later stages can rely on a
// well-formed model: each error names the file, the key path, the 1-based line
// and column, what was expected and what was found. yaml-cpp exceptions never
// leave this file.
#include "libplan/model/model.h"

#include <cassert>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <map>
#include <optional>
#include <set>

#include <yaml-cpp/yaml.h>

#include "libplan/model/ops.h"
#include "libplan/model/yaml_util.h"
#include "libplan/util/files.h"
#include "libplan/util/limits.h"
#include "libplan/util/text.h"

namespace spindle::plan {

int dtype_bytes(DType t) {
  switch (t) {
    case DType::bf16: return 2;
    case DType::fp16: return 2;
    case DType::fp32: return 4;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
    case DType::fp32: return "fp32";
  }
  return "?";
}

int64_t Block::dim(const char* name) const {
  assert(dims.contains(name) && dims.at(name).is_number_integer());
  return dims.at(name).get<int64_t>();
}

bool Module::reads_data() const {
  if (blocks.empty()) return false;
  const OpSpec* spec = find_op(blocks.front().op);
  return spec != nullptr && spec->reads_data;
}

bool Module::is_loss() const {
  if (blocks.empty()) return false;
  const OpSpec* spec = find_op(blocks.back().op);
  return spec != nullptr && spec->is_loss;
}

int64_t Module::in_width() const {
  if (blocks.empty() || reads_data()) return 0;
  return op_in_width(blocks.front().op, blocks.front().dims);
}

int64_t Module::out_width() const {
  if (blocks.empty()) return 0;
  return op_out_width(blocks.back().op, blocks.back().dims);
}

bool Module::pools() const {
  for (const Block& b : blocks) {
    if (const OpSpec* spec = find_op(b.op); spec != nullptr && spec->one_token) return true;
  }
  return false;
}

const Module* Model::find_module(const std::string& module_name) const {
  for (const Module& m : modules) {
    if (m.name == module_name) return &m;
  }
  return nullptr;
}

int64_t Model::parameter_count() const {
  int64_t total = 0;
  for (const Module& m : modules) {
    for (const Block& b : m.blocks) {
      total += static_cast<int64_t>(b.repeat) * op_param_count(b.op, b.dims, m.max_seq);
    }
  }
  return total;
}

namespace {

using yamlu::Entry;
using yamlu::MapView;
using yamlu::Reader;

// Largest integer dimension, seq and batch: products of two stay in int64_t.
constexpr int64_t kMaxSize = limits::kMaxSize;
// Largest total parameter count (10^15), so byte counts stay in int64_t.
constexpr int64_t kMaxParameters = 1000000000000000;

// The key under which a block's input width is given (for width messages).
const char* in_width_key(const std::string& op) {
  const OpSpec* spec = find_op(op);
  return spec != nullptr && spec->in_width != nullptr ? spec->in_width : "op";
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Names end up inside operator ids ("T/N/k.r"), so they may not contain '/'.
Status check_name(const Reader& r, const std::string& path, const YAML::Node& node,
                  const std::string& name, const char* what) {
  if (name.empty()) return r.error(path, node, std::string("expected a non-empty ") + what);
  if (yamlu::invalid_utf8_at(name) != std::string::npos) {
    return r.error(path, node, std::string("expected a ") + what + " of valid UTF-8");
  }
  if (const size_t at = control_char_at(name); at != std::string::npos) {
    return r.error(path, node,
                   std::string("expected a ") + what + " without control characters (found byte " +
                       std::to_string(static_cast<unsigned char>(name[at])) + ")");
  }
  if (name.find('/') != std::string::npos || name.find_first_of(" \t\n") != std::string::npos) {
    return r.error(path, node,
                   std::string("expected a ") + what +
                       " without '/' or spaces (it becomes part of operator ids), found '" + name +
                       "'");
  }
  return Status::Ok();
}

// Parses one block map at `path` into `out`.
Status parse_block(const Reader& r, const std::string& path, const YAML::Node& node, Block& out) {
  if (!node.IsMap()) {
    return r.error(path, node, "expected a block {op: ..., dims...}, found " + yamlu::describe(node));
  }
  MapView view;
  SPINDLE_TRY(r.view_map(path, node, view));
  const Entry* op_entry = view.find("op");
  if (op_entry == nullptr) {
    return r.error(yamlu::child(path, "op"), node, "missing required key 'op' (one of " + [] {
      std::vector<std::string> names;
      for (const OpSpec& s : op_catalogue()) names.emplace_back(s.name);
      return join(names);
    }() + ")");
  }
  std::string op;
  SPINDLE_TRY(r.get_string(yamlu::child(path, "op"), op_entry->value, op));
  const OpSpec* spec = find_op(op);
  if (spec == nullptr) {
    std::vector<std::string> names;
    for (const OpSpec& s : op_catalogue()) names.emplace_back(s.name);
    return r.error(yamlu::child(path, "op"), op_entry->value,
                   "unknown op '" + op + "', expected one of " + join(names));
  }
  out.op = op;
  out.mark = yamlu::mark_of(node);
  out.dims = nlohmann::json::object();

  std::set<std::string> allowed = {"op", "repeat"};
  for (const DimSpec& d : spec->dims) allowed.insert(d.name);
  SPINDLE_TRY(r.reject_unknown(path, view, allowed, "op '" + op + "'"));

  if (const Entry* e = view.find("repeat")) {
    int64_t rep = 0;
    SPINDLE_TRY(r.get_int(yamlu::child(path, "repeat"), e->value, rep));
    if (rep < 1 || rep > limits::kMaxOperators) {
      return r.error(yamlu::child(path, "repeat"), e->value,
                     "expected a repeat count from 1 to " + std::to_string(limits::kMaxOperators) +
                         " (the most operators a model may have), found " + std::to_string(rep));
    }
    out.repeat = static_cast<int>(rep);
  }

  for (const DimSpec& d : spec->dims) {
    const std::string key = yamlu::child(path, d.name);
    const Entry* e = view.find(d.name);
    if (e == nullptr) {
      if (d.required) {
        return r.error(key, node,
                       "missing required dimension '" + std::string(d.name) + "' of op '" + op + "'");
      }
      out.dims[d.name] = d.default_value;
      continue;
    }
    switch (d.kind) {
      case DimKind::Int: {
        int64_t v = 0;
        SPINDLE_TRY(r.get_int(key, e->value, v));
        if (v <= 0) {
          return r.error(key, e->value, "expected a positive integer, found " + std::to_string(v));
        }
        if (v > kMaxSize) {
          return r.error(key, e->value, "expected at most " + std::to_string(kMaxSize) + ", found " +
                                            std::to_string(v));
        }
        out.dims[d.name] = v;
        break;
      }
      case DimKind::Bool: {
        bool v = false;
        SPINDLE_TRY(r.get_bool(key, e->value, v));
        out.dims[d.name] = v;
        break;
      }
      case DimKind::Float: {
        double v = 0;
        SPINDLE_TRY(r.get_number(key, e->value, v));
        if (!(v >= limits::kMinTemperature && v <= limits::kMaxTemperature)) {
          return r.error(key, e->value,
                         "expected a number from " + nlohmann::json(limits::kMinTemperature).dump() + " to " +
                             nlohmann::json(limits::kMaxTemperature).dump() + ", found " + e->value.Scalar());
        }
        out.dims[d.name] = v;
        break;
      }
    }
  }

  if (op == "transformer_layer") {
    const int64_t hidden = out.dim("hidden"), heads = out.dim("heads");
    if (hidden % heads != 0) {
      return r.error(yamlu::child(path, "heads"), view.find("heads")->value,
                     "heads " + std::to_string(heads) + " must divide hidden " +
                         std::to_string(hidden));
    }
  }
  return Status::Ok();
}

// Parses module `name` (a block list or {blocks, tensor_parallel}) at `path`.
Status parse_module(const Reader& r, const std::string& path, const YAML::Node& key_node,
                    const YAML::Node& node, Module& out) {
  out.mark = yamlu::mark_of(key_node);
  YAML::Node blocks_node;
  std::string blocks_path = path;
  const YAML::Node* tp_node = nullptr;
  MapView view;
  if (node.IsSequence()) {
    blocks_node = node;
  } else if (node.IsMap()) {
    SPINDLE_TRY(r.view_map(path, node, view));
    SPINDLE_TRY(r.reject_unknown(path, view, {"blocks", "tensor_parallel"}, "a module"));
    const Entry* b = view.find("blocks");
    if (b == nullptr) return r.error(yamlu::child(path, "blocks"), node, "missing required key 'blocks'");
    blocks_node = b->value;
    blocks_path = yamlu::child(path, "blocks");
    if (const Entry* tp = view.find("tensor_parallel")) {
      int64_t k = 0;
      SPINDLE_TRY(r.get_int(yamlu::child(path, "tensor_parallel"), tp->value, k));
      if (k < 1 || k > limits::kMaxDevices) {
        return r.error(yamlu::child(path, "tensor_parallel"), tp->value,
                       "expected tensor_parallel from 1 to " + std::to_string(limits::kMaxDevices) + ", found " +
                           std::to_string(k));
      }
      out.tensor_parallel = static_cast<int>(k);
      tp_node = &tp->value;
    }
  } else {
    return r.error(path, node,
                   "expected a list of blocks or a map {blocks, tensor_parallel}, found " +
                       yamlu::describe(node));
  }
  if (!blocks_node.IsSequence() || blocks_node.size() == 0) {
    return r.error(blocks_path, blocks_node,
                   "expected a non-empty list of blocks, found " + yamlu::describe(blocks_node));
  }

  for (std::size_t k = 0; k < blocks_node.size(); ++k) {
    const std::string bpath = yamlu::index(blocks_path, k);
    Block block;
    SPINDLE_TRY(parse_block(r, bpath, blocks_node[k], block));
    const OpSpec* spec = find_op(block.op);
    const YAML::Node& bnode = blocks_node[k];
    if (spec->reads_data && k != 0) {
      return r.error(yamlu::child(bpath, "op"), bnode["op"],
                     "op '" + block.op + "' reads data and can only be the first block of a module");
    }
    if (spec->is_loss && k + 1 != blocks_node.size()) {
      return r.error(yamlu::child(bpath, "op"), bnode["op"],
                     "loss op '" + block.op + "' can only be the last block of a module, found " +
                         std::to_string(blocks_node.size() - 1 - k) + " block(s) after it");
    }
    if (block.op == "contrastive_loss" && blocks_node.size() != 1) {
      return r.error(yamlu::child(bpath, "op"), bnode["op"],
                     "contrastive_loss pairs two inputs and must be the only block of its module, "
                     "found " + std::to_string(blocks_node.size()) + " blocks");
    }
    // Each repeat is the next one's input: a data reader or a loss cannot
    // repeat, and a block that repeats keeps its width (a pool_project or
    // linear 32 -> 16 twice planned, and spindle-run failed at step 1 on
    // the second copy's shapes).
    if (block.repeat > 1 && (spec->reads_data || spec->is_loss)) {
      return r.error(yamlu::child(bpath, "repeat"), bnode["repeat"],
                     "op '" + block.op + "' " + (spec->reads_data ? "reads data" : "is a loss") +
                         " and cannot repeat (found repeat " + std::to_string(block.repeat) + ")");
    }
    if (block.repeat > 1 && op_in_width(block.op, block.dims) != op_out_width(block.op, block.dims)) {
      return r.error(yamlu::child(bpath, "repeat"), bnode["repeat"],
                     "a block that repeats must keep its width, each copy feeding the next: " + block.op + " " +
                         std::string(spec->in_width) + " " + std::to_string(op_in_width(block.op, block.dims)) +
                         " to " + spec->out_width + " " + std::to_string(op_out_width(block.op, block.dims)) +
                         " (found repeat " + std::to_string(block.repeat) + ")");
    }
    if (k > 0) {
      const Block& prev = out.blocks.back();
      const int64_t want = op_out_width(prev.op, prev.dims);
      const int64_t have = op_in_width(block.op, block.dims);
      if (want != have) {
        const char* key = in_width_key(block.op);
        return r.error(yamlu::child(bpath, key), bnode[key],
                       "width mismatch inside the module: expected input width " +
                           std::to_string(want) + " (output of block " + std::to_string(k - 1) +
                           ", " + prev.op + "), found " + std::to_string(have));
      }
    }
    out.blocks.push_back(std::move(block));
  }

  if (out.tensor_parallel > 1) {
    const int64_t tp = out.tensor_parallel;
    for (std::size_t k = 0; k < out.blocks.size(); ++k) {
      const Block& b = out.blocks[k];
      for (const char* key : find_op(b.op)->tp_split) {   // a known op: parse_block checked it
        if (b.dim(key) % tp != 0) {
          return r.error(yamlu::child(path, "tensor_parallel"), *tp_node,
                         "tensor_parallel " + std::to_string(tp) + " must divide " + key + " " +
                             std::to_string(b.dim(key)) + " of block " + std::to_string(k) +
                             " (" + b.op + ")");
        }
      }
    }
  }
  return Status::Ok();
}

// A node as written, before the task-level checks.
struct RawNode {
  Node node;
  YAML::Node yaml;
  std::optional<YAML::Node> seq_yaml;
  std::optional<YAML::Node> inputs_yaml;
  std::vector<YAML::Node> input_yaml;  // one per input
};

// One task's nodes while parse_task checks them. raw and index_of are filled
// by read_node (pass 1); the rest by link_node (pass 2), for nodes 0..i.
struct TaskGraph {
  std::vector<RawNode> raw;                         // file order
  std::map<std::string, std::size_t> index_of;      // node id -> index into raw
  std::vector<int64_t> out_seq;                     // per node: its output's seq (1 once pooled)
  std::vector<bool> is_loss;                        // per node: its module ends in a loss
  std::vector<std::vector<std::size_t>> consumers;  // per node: the later nodes it feeds
};

// The task's own keys, `node` being a map viewed as `view` at `path`: rejects
// unknown keys, requires name, batch and nodes, and reads name (a valid name),
// batch (1..kMaxSize samples) and weight (a positive loss weight, default 1)
// into `out`. The nodes are left to the caller.
Status parse_task_keys(const Reader& r, const std::string& path, const YAML::Node& node, const MapView& view,
                       Task& out) {
  SPINDLE_TRY(r.reject_unknown(path, view, {"name", "batch", "weight", "nodes"}, "a task"));
  for (const char* key : {"name", "batch", "nodes"}) {
    if (view.find(key) == nullptr) {
      return r.error(yamlu::child(path, key), node, "missing required key '" + std::string(key) + "'");
    }
  }
  const YAML::Node& name_node = view.find("name")->value;
  SPINDLE_TRY(r.get_string(yamlu::child(path, "name"), name_node, out.name));
  SPINDLE_TRY(check_name(r, yamlu::child(path, "name"), name_node, out.name, "task name"));

  const YAML::Node& batch_node = view.find("batch")->value;
  SPINDLE_TRY(r.get_int(yamlu::child(path, "batch"), batch_node, out.batch));
  if (out.batch <= 0 || out.batch > kMaxSize) {
    return r.error(yamlu::child(path, "batch"), batch_node,
                   (out.batch <= 0 ? std::string("expected a positive batch size")
                                   : "expected a batch size of at most " + std::to_string(kMaxSize)) +
                       ", found " + std::to_string(out.batch));
  }
  if (const Entry* w = view.find("weight")) {
    SPINDLE_TRY(r.get_number(yamlu::child(path, "weight"), w->value, out.weight));
    if (!(out.weight >= limits::kMinLossWeight && out.weight <= limits::kMaxLossWeight)) {
      return r.error(yamlu::child(path, "weight"), w->value,
                     "expected a positive loss weight from " + nlohmann::json(limits::kMinLossWeight).dump() + " to " +
                         nlohmann::json(limits::kMaxLossWeight).dump() + ", found " + w->value.Scalar());
    }
  }
  return Status::Ok();
}

// Pass 1 for node i, `nn` at `npath`: its syntax alone. Fills g.raw[i] (id,
// module, seq if given, input ids as written, and the YAML nodes for later
// messages) and g.index_of; the id must be new to the task and the module one
// of `model`'s. Nothing is checked against other nodes but the id.
Status read_node(const Reader& r, const std::string& npath, const YAML::Node& nn, const Model& model,
                 std::size_t i, TaskGraph& g) {
  RawNode& rn = g.raw[i];
  rn.yaml = nn;
  if (!nn.IsMap()) {
    return r.error(npath, nn, "expected a node map {id, module, ...}, found " + yamlu::describe(nn));
  }
  rn.node.mark = yamlu::mark_of(nn);
  MapView nv;
  SPINDLE_TRY(r.view_map(npath, nn, nv));
  SPINDLE_TRY(r.reject_unknown(npath, nv, {"id", "module", "seq", "inputs"}, "a node"));
  for (const char* key : {"id", "module"}) {
    if (nv.find(key) == nullptr) {
      return r.error(yamlu::child(npath, key), nn, "missing required key '" + std::string(key) + "'");
    }
  }
  const YAML::Node& id_node = nv.find("id")->value;
  SPINDLE_TRY(r.get_string(yamlu::child(npath, "id"), id_node, rn.node.id));
  SPINDLE_TRY(check_name(r, yamlu::child(npath, "id"), id_node, rn.node.id, "node id"));
  if (auto it = g.index_of.find(rn.node.id); it != g.index_of.end()) {
    return r.error(yamlu::child(npath, "id"), id_node,
                   "duplicate node id '" + rn.node.id + "' (first used by nodes[" +
                       std::to_string(it->second) + "], line " +
                       std::to_string(g.raw[it->second].node.mark.line) + ")");
  }
  g.index_of[rn.node.id] = i;
  const YAML::Node& module_node = nv.find("module")->value;
  SPINDLE_TRY(r.get_string(yamlu::child(npath, "module"), module_node, rn.node.module));
  if (model.find_module(rn.node.module) == nullptr) {
    std::vector<std::string> names;
    for (const Module& m : model.modules) names.push_back(m.name);
    return r.error(yamlu::child(npath, "module"), module_node,
                   "unknown module '" + rn.node.module + "', expected one of " + join(names));
  }
  if (const Entry* s = nv.find("seq")) {
    SPINDLE_TRY(r.get_int(yamlu::child(npath, "seq"), s->value, rn.node.seq));
    if (rn.node.seq <= 0 || rn.node.seq > kMaxSize) {
      return r.error(yamlu::child(npath, "seq"), s->value,
                     (rn.node.seq <= 0 ? std::string("expected a positive sequence length")
                                       : "expected a sequence length of at most " + std::to_string(kMaxSize)) +
                         ", found " + std::to_string(rn.node.seq));
    }
    rn.seq_yaml = s->value;
  }
  if (const Entry* in = nv.find("inputs")) {
    rn.inputs_yaml = in->value;
    const std::string ipath = yamlu::child(npath, "inputs");
    if (!in->value.IsSequence()) {
      return r.error(ipath, in->value,
                     "expected a list of node ids, found " + yamlu::describe(in->value));
    }
    for (std::size_t j = 0; j < in->value.size(); ++j) {
      std::string id;
      SPINDLE_TRY(r.get_string(yamlu::index(ipath, j), in->value[j], id));
      rn.node.inputs.push_back(id);
      rn.input_yaml.push_back(in->value[j]);
    }
  }
  return Status::Ok();
}

// Pass 2, the inputs of node i (of module m, which does not read data; its
// inputs list at `ipath`): each names an earlier node of task `task_name`,
// once, that is not a loss, whose output width is m's input width (and, for a
// contrastive_loss, is pooled). Appends i to each input's consumers; sets
// seq_sum to the sum of the inputs' output seqs and seq_terms to that sum
// spelled out ("a 16 + b 32") for messages.
Status link_inputs(const Reader& r, const std::string& ipath, const Model& model, const std::string& task_name,
                   const Module& m, std::size_t i, TaskGraph& g, int64_t& seq_sum, std::string& seq_terms) {
  const RawNode& rn = g.raw[i];
  const Node& n = rn.node;
  std::set<std::string> seen;
  for (std::size_t j = 0; j < n.inputs.size(); ++j) {
    const std::string& in_id = n.inputs[j];
    const std::string jpath = yamlu::index(ipath, j);
    const YAML::Node& jy = rn.input_yaml[j];
    auto it = g.index_of.find(in_id);
    if (it == g.index_of.end()) {
      std::vector<std::string> earlier;
      for (std::size_t e = 0; e < i; ++e) earlier.push_back(g.raw[e].node.id);
      return r.error(jpath, jy,
                     "unknown input '" + in_id + "': task '" + task_name +
                         "' has no node with this id (earlier nodes: " +
                         (earlier.empty() ? std::string("none") : join(earlier)) + ")");
    }
    const std::size_t src = it->second;
    if (src == i) {
      return r.error(jpath, jy,
                     "node '" + n.id + "' lists itself as an input, which creates a cycle");
    }
    if (src > i) {
      return r.error(jpath, jy,
                     "input '" + in_id + "' is not an earlier node: it is defined later (nodes[" +
                         std::to_string(src) + "], line " +
                         std::to_string(g.raw[src].node.mark.line) +
                         "); inputs must name earlier nodes, and this one creates a cycle "
                         "or a forward reference");
    }
    if (!seen.insert(in_id).second) {
      return r.error(jpath, jy, "input '" + in_id + "' is listed twice");
    }
    const Module& sm = *model.find_module(g.raw[src].node.module);
    if (g.is_loss[src]) {
      return r.error(jpath, jy,
                     "input '" + in_id + "' is a loss node (module '" + sm.name +
                         "'); a loss cannot feed another node");
    }
    const int64_t want = m.in_width();
    const int64_t have = sm.out_width();
    // What reaches the loss is one token per sample: pooled by the input's
    // module, or by a module before it (a projection head of its own).
    if (m.blocks.front().op == "contrastive_loss" && g.out_seq[src] != 1) {
      return r.error(jpath, jy,
                     "input '" + in_id + "' is not pooled: contrastive_loss needs [b, 1, " +
                         std::to_string(want) + "] inputs, but the output of module '" + sm.name +
                         "' has seq " + std::to_string(g.out_seq[src]) +
                         " (pool it with a pool_project, in its module or one before it)");
    }
    if (have != want) {
      return r.error(jpath, jy,
                     "width mismatch: input '" + in_id + "' has width " + std::to_string(have) +
                         " (output of module '" + sm.name + "'), but module '" + m.name +
                         "' expects width " + std::to_string(want));
    }
    seq_sum += g.out_seq[src];
    seq_terms += (seq_terms.empty() ? "" : " + ") + in_id + " " + std::to_string(g.out_seq[src]);
    g.consumers[src].push_back(i);
  }
  return Status::Ok();
}

// Pass 2 for node i at `npath`, nodes 0..i-1 linked already. A node whose
// module reads data takes no inputs and must give seq. Any other must list
// inputs (link_inputs); its seq is derived, 1 for a contrastive_loss (exactly
// two inputs) and else the sum of its inputs' seqs (an lm_loss: exactly one
// input), at most kMaxSize and equal to seq when given. Sets g.is_loss[i]
// and g.out_seq[i] (1 when the module pools) and the node's seq.
Status link_node(const Reader& r, const std::string& npath, const Model& model, const std::string& task_name,
                 std::size_t i, TaskGraph& g) {
  RawNode& rn = g.raw[i];
  Node& n = rn.node;
  const std::string ipath = yamlu::child(npath, "inputs");
  const Module& m = *model.find_module(n.module);
  g.is_loss[i] = m.is_loss();

  if (m.reads_data()) {
    if (rn.inputs_yaml) {
      return r.error(ipath, *rn.inputs_yaml,
                     "node '" + n.id + "' of module '" + m.name + "' (" + m.blocks[0].op +
                         ") reads data and takes no inputs, found " +
                         yamlu::describe(*rn.inputs_yaml));
    }
    if (!rn.seq_yaml) {
      return r.error(yamlu::child(npath, "seq"), rn.yaml,
                     "missing required key 'seq': node '" + n.id + "' of module '" + m.name +
                         "' reads data and must give its sequence length");
    }
  } else {
    if (n.inputs.empty()) {
      const YAML::Node& at = rn.inputs_yaml ? *rn.inputs_yaml : rn.yaml;
      return r.error(ipath, at,
                     "missing inputs: node '" + n.id + "' of module '" + m.name +
                         "' does not read data and must list its inputs (ids of earlier "
                         "nodes of task '" + task_name + "')");
    }
    int64_t seq_sum = 0;
    std::string seq_terms;
    SPINDLE_TRY(link_inputs(r, ipath, model, task_name, m, i, g, seq_sum, seq_terms));
    const std::string& first_op = m.blocks.front().op;
    if (first_op == "contrastive_loss" && n.inputs.size() != 2) {
      return r.error(ipath, *rn.inputs_yaml,
                     "contrastive_loss needs exactly two pooled inputs, found " +
                         std::to_string(n.inputs.size()));
    }
    if (first_op == "lm_loss" && n.inputs.size() != 1) {
      return r.error(ipath, *rn.inputs_yaml,
                     "lm_loss takes exactly one input, found " + std::to_string(n.inputs.size()));
    }
    const int64_t derived = first_op == "contrastive_loss" ? 1 : seq_sum;
    if (derived > kMaxSize) {  // each term is at most kMaxSize, so the sum did not overflow
      return r.error(ipath, *rn.inputs_yaml,
                     "sequence length " + std::to_string(derived) + " (" + seq_terms +
                         ") is more than " + std::to_string(kMaxSize));
    }
    if (rn.seq_yaml && n.seq != derived) {
      const std::string why = first_op == "contrastive_loss"
                                  ? std::string("a contrastive_loss node has seq 1")
                                  : "the sum of its inputs' sequence lengths (" + seq_terms + ")";
      return r.error(yamlu::child(npath, "seq"), *rn.seq_yaml,
                     "seq mismatch: expected " + std::to_string(derived) + ", " + why +
                         ", found " + std::to_string(n.seq));
    }
    n.seq = derived;
  }
  g.out_seq[i] = m.pools() ? 1 : n.seq;
  return Status::Ok();
}

// After pass 2: task `task_name` (its nodes list `nodes_node` at `nodes_path`)
// has at least one loss node, and every node reaches a loss (some loss
// depends on it).
Status check_losses(const Reader& r, const std::string& nodes_path, const YAML::Node& nodes_node,
                    const std::string& task_name, const TaskGraph& g) {
  bool any_loss = false;
  for (bool l : g.is_loss) any_loss = any_loss || l;
  if (!any_loss) {
    return r.error(nodes_path, nodes_node,
                   "task '" + task_name +
                       "' has no loss node: every task must end in at least one loss "
                       "(a module ending in contrastive_loss or lm_loss)");
  }
  // Consumers come later in file order, so one backward sweep decides reach.
  std::vector<bool> reaches(g.raw.size(), false);
  for (std::size_t i = g.raw.size(); i-- > 0;) {
    reaches[i] = g.is_loss[i];
    for (std::size_t c : g.consumers[i]) reaches[i] = reaches[i] || reaches[c];
  }
  for (std::size_t i = 0; i < g.raw.size(); ++i) {
    if (!reaches[i]) {
      return r.error(yamlu::index(nodes_path, i), g.raw[i].yaml,
                     "node '" + g.raw[i].node.id + "' does not reach a loss: no loss of task '" +
                         task_name + "' depends on it");
    }
  }
  return Status::Ok();
}

// Parses task `node` at `path` into `out`, against the modules of `model`:
// its keys (parse_task_keys), then every node's syntax (read_node), then the
// graph in file order (link_node), then its losses (check_losses). The first
// error found is returned, naming file, key and line.
Status parse_task(const Reader& r, const std::string& path, const YAML::Node& node,
                  const Model& model, Task& out) {
  if (!node.IsMap()) {
    return r.error(path, node, "expected a task map {name, batch, nodes}, found " + yamlu::describe(node));
  }
  out.mark = yamlu::mark_of(node);
  MapView view;
  SPINDLE_TRY(r.view_map(path, node, view));
  SPINDLE_TRY(parse_task_keys(r, path, node, view, out));

  const std::string nodes_path = yamlu::child(path, "nodes");
  const YAML::Node& nodes_node = view.find("nodes")->value;
  if (!nodes_node.IsSequence() || nodes_node.size() == 0) {
    return r.error(nodes_path, nodes_node,
                   "expected a non-empty list of nodes, found " + yamlu::describe(nodes_node));
  }

  // Pass 1: syntax of every node, unique ids.
  TaskGraph g;
  g.raw.resize(nodes_node.size());
  for (std::size_t i = 0; i < nodes_node.size(); ++i) {
    SPINDLE_TRY(read_node(r, yamlu::index(nodes_path, i), nodes_node[i], model, i, g));
  }

  // Pass 2: the graph. Inputs name earlier nodes only, so file order is a
  // topological order and the graph is acyclic by construction.
  g.out_seq.assign(g.raw.size(), 0);
  g.is_loss.assign(g.raw.size(), false);
  g.consumers.assign(g.raw.size(), {});
  for (std::size_t i = 0; i < g.raw.size(); ++i) {
    SPINDLE_TRY(link_node(r, yamlu::index(nodes_path, i), model, out.name, i, g));
  }

  SPINDLE_TRY(check_losses(r, nodes_path, nodes_node, out.name, g));
  for (RawNode& rn : g.raw) out.nodes.push_back(std::move(rn.node));
  return Status::Ok();
}
// The model's name (non-empty, a valid name) and dtype (bf16, fp16 or fp32;
// default as in Model) from the root map's `view` into `model`.
Status parse_model_header(const Reader& r, const MapView& view, Model& model) {
  SPINDLE_TRY(r.get_string("name", view.find("name")->value, model.name));
  if (model.name.empty()) return r.error("name", view.find("name")->value, "expected a non-empty name");
  SPINDLE_TRY(check_name(r, "name", view.find("name")->value, model.name, "model name"));

  if (const Entry* d = view.find("dtype")) {
    std::string dt;
    SPINDLE_TRY(r.get_string("dtype", d->value, dt));
    if (dt == "bf16") {
      model.dtype = DType::bf16;
    } else if (dt == "fp16") {
      model.dtype = DType::fp16;
    } else if (dt == "fp32") {
      model.dtype = DType::fp32;
    } else {
      return r.error("dtype", d->value, "expected one of bf16, fp16, fp32, found '" + dt + "'");
    }
  }
  return Status::Ok();
}

// The `modules` map (name -> module, at least one; extension keys skipped)
// appended to model.modules in file order.
Status parse_modules(const Reader& r, const YAML::Node& modules_node, Model& model) {
  if (!modules_node.IsMap()) {
    return r.error("modules", modules_node,
                   "expected a map of module name -> blocks, found " + yamlu::describe(modules_node));
  }
  MapView mview;
  SPINDLE_TRY(r.view_map("modules", modules_node, mview));
  for (const std::string& name : mview.order) {
    if (yamlu::is_extension_key(name)) continue;
    const Entry& e = *mview.find(name);
    const std::string path = yamlu::child("modules", name);
    Module m;
    m.name = name;
    SPINDLE_TRY(check_name(r, path, e.key, name, "module name"));
    SPINDLE_TRY(parse_module(r, path, e.key, e.value, m));
    model.modules.push_back(std::move(m));
  }
  if (model.modules.empty()) {
    return r.error("modules", modules_node, "expected at least one module, found none");
  }
  return Status::Ok();
}

// The `tasks` list (at least one, unique names) appended to model.tasks in
// file order; model.modules must be parsed already.
Status parse_tasks(const Reader& r, const YAML::Node& tasks_node, Model& model) {
  if (!tasks_node.IsSequence() || tasks_node.size() == 0) {
    return r.error("tasks", tasks_node,
                   "expected a non-empty list of tasks, found " + yamlu::describe(tasks_node));
  }
  std::map<std::string, std::size_t> task_index;
  for (std::size_t t = 0; t < tasks_node.size(); ++t) {
    const std::string path = yamlu::index("tasks", t);
    Task task;
    SPINDLE_TRY(parse_task(r, path, tasks_node[t], model, task));
    if (auto it = task_index.find(task.name); it != task_index.end()) {
      return r.error(yamlu::child(path, "name"), tasks_node[t]["name"],
                     "duplicate task name '" + task.name + "' (first used by tasks[" +
                         std::to_string(it->second) + "])");
    }
    task_index[task.name] = t;
    model.tasks.push_back(std::move(task));
  }
  return Status::Ok();
}

// Sets every module's max_seq (S): the largest seq it is used with anywhere.
void set_max_seq(Model& model) {
  for (Module& m : model.modules) {
    for (const Task& task : model.tasks) {
      for (const Node& n : task.nodes) {
        if (n.module == m.name && n.seq > m.max_seq) m.max_seq = n.seq;
      }
    }
  }
}

// The parsed model's size: at most kMaxParameters parameters (max_seq set)
// and at most limits::kMaxOperators operators once expanded.
Status check_model_size(const Reader& r, const Model& model) {
  // Every size is at most kMaxSize, so one operator's count fits in int64_t;
  // the total (times repeat) is checked.
  int64_t total = 0;
  for (const Module& m : model.modules) {
    for (const Block& b : m.blocks) {
      int64_t block_total = 0;
      if (__builtin_mul_overflow(op_param_count(b.op, b.dims, m.max_seq), int64_t{b.repeat}, &block_total) ||
          __builtin_add_overflow(total, block_total, &total) || total > kMaxParameters) {
        return make_error(Where{r.file, yamlu::child("modules", m.name), m.mark.line, m.mark.column},
                          "the model has more than " + std::to_string(kMaxParameters) +
                              " parameters (at module '" + m.name + "')");
      }
    }
  }
  // The operator graph's size, before anything is expanded: every node
  // expands its module's blocks, repeat included. Each count is at most
  // kMaxOperators, so the sums below cannot overflow before the check.
  int64_t operators = 0;
  for (std::size_t t = 0; t < model.tasks.size(); ++t) {
    for (const Node& n : model.tasks[t].nodes) {
      const Module* m = model.find_module(n.module);
      if (m == nullptr) continue;
      for (const Block& b : m->blocks) operators += b.repeat;
      if (operators > limits::kMaxOperators) {
        const Mark& at = model.tasks[t].mark;
        return make_error(Where{r.file, yamlu::index("tasks", t), at.line, at.column},
                          "the model expands to more than " + std::to_string(limits::kMaxOperators) +
                              " operators (blocks x repeat over every node of every task; reached at task '" +
                              model.tasks[t].name + "', node '" + n.id + "')");
      }
    }
  }
  return Status::Ok();
}

// A model document's root: its keys, then the header, the modules, the
// tasks (against the modules), every module's max_seq and the model's size.
Result<Model> parse_model_yaml(const Reader& r, const YAML::Node& root) {
  Model model;
  if (!root.IsMap()) {
    return r.error("", root, "expected a map with keys name, modules, tasks, found " + yamlu::describe(root));
  }
  MapView view;
  SPINDLE_TRY(r.view_map("", root, view));
  SPINDLE_TRY(r.reject_unknown("", view, {"name", "dtype", "modules", "tasks"}, "a model"));
  for (const char* key : {"name", "modules", "tasks"}) {
    if (view.find(key) == nullptr) {
      return r.error(key, root, "missing required key '" + std::string(key) + "'");
    }
  }
  SPINDLE_TRY(parse_model_header(r, view, model));
  SPINDLE_TRY(parse_modules(r, view.find("modules")->value, model));
  SPINDLE_TRY(parse_tasks(r, view.find("tasks")->value, model));
  set_max_seq(model);
  SPINDLE_TRY(check_model_size(r, model));
  return model;
}

}  // namespace

Result<Model> parse_model_string(const std::string& yaml_text, const std::string& path) {
  return yamlu::parse_yaml_document<Model>(yaml_text, path, "model", parse_model_yaml);
}

Result<Model> load_model(const std::string& path) {
  Result<std::string> text = read_file(path);
  if (!text.ok()) return text.error();
  return parse_model_string(*text, path);
}

}  // namespace spindle::plan
