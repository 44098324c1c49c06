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
  bool reads_data = false;     // patch_embed, token_embed: no input activation
  bool is_loss = false;        // contrastive_loss, lm_loss: scalar output
  bool one_token = false;      // pool_project: its output has seq 1, whatever its input's
  bool whole_batch = false;    // contrastive_loss: couples samples, gathers its slice's whole batch
  bool reads_targets = false;  // lm_loss: its forward also reads the batch's targets from the data
  const char* in_width = nullptr;   // the dimension that is its input's width (nullptr: reads data)
  const char* out_width = nullptr;  // the dimension that is its output's width (nullptr: a loss)
  // Dimensions split over the tensor-parallel ranks (Megatron's layout):
  // each must be a multiple of the module's tensor_parallel. Ops with none
  // run whole on every rank.
  std::vector<const char*> tp_split = {};
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
// Tokens per sample of the operator's output: 1 for one_token ops, else `seq`.
int64_t op_out_seq(const std::string& op, int64_t seq);
// Values per sample of the output activation: op_out_seq x op_out_width
// (0 for losses). What moves between slices, per batch row.
int64_t op_out_values_per_sample(const std::string& op, const nlohmann::json& dims, int64_t seq);
// True for ops whose spec says whole_batch (a loss that couples samples).
bool op_needs_whole_batch(const std::string& op);
// True for ops whose forward reads the data: its input (reads_data) or the
// targets (reads_targets). The runtime draws that data inside the forward,
// so spindle-profile times it there too.
bool op_reads_from_data(const std::string& op);
// One parameter tensor of an operator (docs/spec/ops.md lists them): its
// name in the op's parameter set ("M/k.r/<name>"), its full shape (without
// tensor parallelism) and the axis a tensor-parallel group splits it along
// into equal blocks, one per rank (-1: whole on every rank). The one list
// of them: the planner counts parameters from it, spindle-run allocates
// and initialises them from it, in this order (a bucket's flat layout
// follows it).
struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;
  int shard_axis = -1;
  int64_t values() const;   // of the full shape
  // Of one rank's block in a tensor-parallel group of `tensor_parallel`:
  // 1/K of the values when split, all of them when whole.
  int64_t shard_values(int tensor_parallel) const;
};
// Whether tensor-parallel rank `tp_rank`'s copy of a tensor split along
// `shard_axis` stands for its values: every rank's own block of a split
// tensor (>= 0), and of a tensor whole on every rank of the group (-1)
// rank 0's copy alone, the others holding the same values. The gradient
// norm counts those copies alone (Lowered::norm_values, the executor's
// norm_sum), and a checkpoint and --dump-grads take them alone.
inline bool tp_copy_counts(int shard_axis, int tp_rank) { return shard_axis >= 0 || tp_rank == 0; }
// The parameter tensors of `op` with `dims` (filled in); `max_seq` the
// module's S, the rows of the position tables. Empty for an op without
// parameters (contrastive_loss) or an unknown one.
std::vector<ParamTensor> op_param_tensors(const std::string& op, const nlohmann::json& dims, int64_t max_seq);
// The values of op_param_tensors, full shapes.
int64_t op_param_count(const std::string& op, const nlohmann::json& dims, int64_t max_seq);
// Parameter values one tensor-parallel rank of `tensor_parallel` holds, as the
// runtime allocates them (op_param_tensors): tensors split along one axis
// hold 1/K of their values (transformer_layer: q, k, v, o, MLP weights and
// the column-parallel biases; lm_loss: the vocabulary projection), the
// others (LayerNorms, row-parallel biases, every tensor of the other ops)
// are whole on every rank. K divides every split axis of a valid model.
int64_t op_shard_param_count(const std::string& op, const nlohmann::json& dims, int64_t max_seq,
                             int tensor_parallel);

}  // namespace spindle::plan
