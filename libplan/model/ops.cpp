// The operator catalogue of spec/model.md: one table, and the widths and
// parameter counts of its table row "input -> output" and "parameters".
#include "libplan/model/ops.h"

#include <cmath>

#include "libplan/util/limits.h"

namespace spindle::plan {

namespace {

using nlohmann::json;

// Integer dimension `name` of `dims`; 0 when absent or not an integer (the
// parser guarantees presence, so 0 only shows up on unvalidated input).
int64_t dim_of(const json& dims, const char* name) {
  auto it = dims.find(name);
  if (it == dims.end() || !it->is_number_integer()) return 0;
  return it->get<int64_t>();
}

}  // namespace

const std::vector<OpSpec>& op_catalogue() {
  static const std::vector<OpSpec> catalogue = {
      {.name = "patch_embed",
       .dims = {{"in_dim", DimKind::Int, true, nullptr}, {"hidden", DimKind::Int, true, nullptr}},
       .reads_data = true,
       .out_width = "hidden"},
      {.name = "token_embed",
       .dims = {{"vocab", DimKind::Int, true, nullptr}, {"hidden", DimKind::Int, true, nullptr}},
       .reads_data = true,
       .out_width = "hidden"},
      {.name = "transformer_layer",
       .dims = {{"hidden", DimKind::Int, true, nullptr},
                {"heads", DimKind::Int, true, nullptr},
                {"ffn", DimKind::Int, true, nullptr},
                {"causal", DimKind::Bool, false, json(false)}},
       .in_width = "hidden",
       .out_width = "hidden",
       .tp_split = {"heads", "ffn"}},
      {.name = "linear",
       .dims = {{"in", DimKind::Int, true, nullptr}, {"out", DimKind::Int, true, nullptr}},
       .in_width = "in",
       .out_width = "out"},
      {.name = "pool_project",
       .dims = {{"in", DimKind::Int, true, nullptr}, {"out", DimKind::Int, true, nullptr}},
       .one_token = true,
       .in_width = "in",
       .out_width = "out"},
      {.name = "contrastive_loss",
       .dims = {{"dim", DimKind::Int, true, nullptr}, {"temperature", DimKind::Float, false, json(0.07)}},
       .is_loss = true,
       .whole_batch = true,
       .in_width = "dim"},
      {.name = "lm_loss",
       .dims = {{"hidden", DimKind::Int, true, nullptr}, {"vocab", DimKind::Int, true, nullptr}},
       .is_loss = true,
       .reads_targets = true,
       .in_width = "hidden",
       .tp_split = {"vocab"}},
  };
  return catalogue;
}

int64_t op_out_seq(const std::string& op, int64_t seq) {
  const OpSpec* spec = find_op(op);
  return spec != nullptr && spec->one_token ? 1 : seq;
}

int64_t op_out_values_per_sample(const std::string& op, const json& dims, int64_t seq) {
  return op_out_seq(op, seq) * op_out_width(op, dims);
}

bool op_needs_whole_batch(const std::string& op) {
  const OpSpec* spec = find_op(op);
  return spec != nullptr && spec->whole_batch;
}

bool op_reads_from_data(const std::string& op) {
  const OpSpec* spec = find_op(op);
  return spec != nullptr && (spec->reads_data || spec->reads_targets);
}

const OpSpec* find_op(const std::string& name) {
  for (const OpSpec& spec : op_catalogue()) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

std::string op_dims_problem(const OpSpec& spec, const json& dims) {
  if (!dims.is_object()) return std::string("expected an object of dimensions, found ") + dims.type_name();
  for (const auto& item : dims.items()) {
    bool known = false;
    for (const DimSpec& d : spec.dims) known = known || item.key() == d.name;
    if (!known) return "unknown dimension '" + item.key() + "' for op '" + spec.name + "'";
  }
  for (const DimSpec& d : spec.dims) {
    auto it = dims.find(d.name);
    const std::string name = std::string("dimension '") + d.name + "'";
    if (it == dims.end()) return name + " missing (dims are written with defaults filled in)";
    switch (d.kind) {
      case DimKind::Int:
        if (!it->is_number_integer()) return name + ": expected an integer, found " + it->type_name();
        if (it->is_number_unsigned() ? it->get<uint64_t>() > uint64_t(limits::kMaxSize)
                                     : (it->get<int64_t>() < 1 || it->get<int64_t>() > limits::kMaxSize)) {
          return name + ": expected an integer from 1 to " + std::to_string(limits::kMaxSize);
        }
        if (it->is_number_unsigned() && it->get<uint64_t>() < 1) return name + ": expected at least 1";
        break;
      case DimKind::Bool:
        if (!it->is_boolean()) return name + ": expected true or false, found " + it->type_name();
        break;
      case DimKind::Float:
        if (!it->is_number() || !(it->get<double>() >= limits::kMinTemperature) ||
            !(it->get<double>() <= limits::kMaxTemperature)) {
          return name + ": expected a number from " + json(limits::kMinTemperature).dump() + " to " +
                 json(limits::kMaxTemperature).dump();
        }
        break;
    }
  }
  return "";
}

int64_t op_in_width(const std::string& op, const json& dims) {
  const OpSpec* spec = find_op(op);   // data readers and unknown ops have no input width
  return spec != nullptr && spec->in_width != nullptr ? dim_of(dims, spec->in_width) : 0;
}

int64_t op_out_width(const std::string& op, const json& dims) {
  const OpSpec* spec = find_op(op);   // losses produce a scalar
  return spec != nullptr && spec->out_width != nullptr ? dim_of(dims, spec->out_width) : 0;
}

std::vector<ParamTensor> op_param_tensors(const std::string& op, const json& dims, int64_t max_seq) {
  using Shape = std::vector<int64_t>;
  if (op == "patch_embed") {
    const int64_t in = dim_of(dims, "in_dim"), h = dim_of(dims, "hidden");
    return {{"w", Shape{in, h}}, {"bias", Shape{h}}, {"pos", Shape{max_seq, h}}};
  }
  if (op == "token_embed") {
    const int64_t v = dim_of(dims, "vocab"), h = dim_of(dims, "hidden");
    return {{"table", Shape{v, h}}, {"pos", Shape{max_seq, h}}};
  }
  if (op == "transformer_layer") {
    // Megatron's split: q, k, v and the first MLP weight by columns (with
    // their biases), the output and second MLP weights by rows; the
    // LayerNorms and the row-parallel biases whole on every rank.
    const int64_t h = dim_of(dims, "hidden"), f = dim_of(dims, "ffn");
    std::vector<ParamTensor> t = {{"ln1_g", Shape{h}}, {"ln1_b", Shape{h}}};
    for (const char* n : {"q", "k", "v"}) {
      t.push_back({std::string("w_") + n, Shape{h, h}, 1});
      t.push_back({std::string("b_") + n, Shape{h}, 0});
    }
    t.push_back({"w_o", Shape{h, h}, 0});
    t.push_back({"b_o", Shape{h}});
    t.push_back({"ln2_g", Shape{h}});
    t.push_back({"ln2_b", Shape{h}});
    t.push_back({"w_1", Shape{h, f}, 1});
    t.push_back({"b_1", Shape{f}, 0});
    t.push_back({"w_2", Shape{f, h}, 0});
    t.push_back({"b_2", Shape{h}});
    return t;
  }
  if (op == "linear") {
    const int64_t in = dim_of(dims, "in"), out = dim_of(dims, "out");
    return {{"w", Shape{in, out}}, {"bias", Shape{out}}};
  }
  if (op == "pool_project") {
    const int64_t in = dim_of(dims, "in"), out = dim_of(dims, "out");
    return {{"ln_g", Shape{in}}, {"ln_b", Shape{in}}, {"w", Shape{in, out}}, {"bias", Shape{out}}};
  }
  if (op == "lm_loss") {   // the vocabulary projection split by vocabulary
    const int64_t h = dim_of(dims, "hidden"), v = dim_of(dims, "vocab");
    return {{"ln_g", Shape{h}}, {"ln_b", Shape{h}}, {"w", Shape{h, v}, 1}};
  }
  return {};   // contrastive_loss has no parameters
}

int64_t ParamTensor::values() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t ParamTensor::shard_values(int tensor_parallel) const {
  return shard_axis >= 0 && tensor_parallel > 1 ? values() / tensor_parallel : values();
}

int64_t op_param_count(const std::string& op, const json& dims, int64_t max_seq) {
  int64_t n = 0;
  for (const ParamTensor& t : op_param_tensors(op, dims, max_seq)) n += t.values();
  return n;
}

int64_t op_shard_param_count(const std::string& op, const json& dims, int64_t max_seq, int tensor_parallel) {
  int64_t n = 0;
  for (const ParamTensor& t : op_param_tensors(op, dims, max_seq)) n += t.shard_values(tensor_parallel);
  return n;
}

}  // namespace spindle::plan
