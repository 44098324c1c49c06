// Parameters of operators and their deterministic initialisation.
//
// A ParamSet holds the parameters of one "M/k.r" (spec/plan.md): every
// operator that uses the same module block repetition shares one ParamSet,
// across tasks. The executor owns ParamSets; op states point at them.
// Under tensor parallelism (TP group of K ranks) a sharded parameter holds
// block `tp rank` of K equal blocks along `shard_axis` of its full shape;
// a replicated one holds the full tensor on every rank (its gradients are
// equal on every rank of the TP group).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "libexec/tensor.h"

namespace spindle::exec {

struct Param {
  std::string name;     // "M/k.r/<tensor>", e.g. "text/1.0/w_q"
  Shape full_shape;     // shape without tensor parallelism
  int shard_axis = -1;  // -1: replicated; else the axis split over the TP group
  Tensor value;         // local block (full tensor when replicated)
  Tensor grad;          // same shape as value; backward adds into it, the executor zeroes it
};

struct ParamSet {
  std::string name;           // "M/k.r"
  std::vector<Param> params;  // in a fixed order per op kind
  int init_threads = 1;       // host threads add_param seeds values on (the values do not depend on it)

  // The parameter whose name ends in "/" + tensor; throws std::out_of_range if none.
  Param& get(const std::string& tensor);
  int64_t local_count() const;  // elements held here
  int64_t full_count() const;   // elements without TP: equals plan::op_param_count
  void zero_grads();
};

enum class InitKind { zeros, ones, uniform, normal };
struct InitSpec {
  InitKind kind = InitKind::zeros;
  float scale = 0;  // uniform: bound (values in [-scale, scale)); normal: standard deviation
};

// Appends "<set name>/<tensor>" to `set`, drawing element e of the FULL tensor
// as a function of (seed, hash of the param name, e) and keeping the local
// block: identical on every device count and TP degree.
void add_param(ParamSet& set, const std::string& tensor, Shape full_shape, int shard_axis,
               int tp_rank, int tp_size, uint64_t seed, InitSpec init);

}  // namespace spindle::exec
