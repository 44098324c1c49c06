// What every operator is built from, and the op kinds of the catalogue
// (spec/model.md, libplan/model/ops.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "libexec/comm/comm.h"

namespace spindle::exec {

enum class OpKind {
  patch_embed,
  token_embed,
  transformer_layer,
  linear,
  pool_project,
  contrastive_loss,
  lm_loss,
};

std::optional<OpKind> op_kind(std::string_view name);  // nullopt for an unknown name
const char* op_name(OpKind kind);

struct OpConfig {
  OpKind kind = OpKind::linear;
  nlohmann::json dims;   // filled-in dims (plan::Block::dims, plan::Workload::dims)
  int64_t max_seq = 0;   // S of the module: rows of the position tables
  // Tensor parallelism: this operator is TP rank tp_rank of tp_size (the
  // shard shapes follow from these alone), and `tp` is the group's
  // communicator for the op's collectives in forward and backward (not
  // owned; nullptr when tp_size is 1, or when only shapes are needed, as
  // for make_params).
  int tp_rank = 0;
  int tp_size = 1;
  Comm* tp = nullptr;

  // Sets tp_rank, tp_size and tp from a TP group's communicator (nullptr:
  // no tensor parallelism).
  void use_tp(Comm* group);
  int64_t dim(const char* name) const;   // integer dim; throws std::invalid_argument if absent
  bool flag(const char* name, bool default_value) const;
  double real(const char* name, double default_value) const;
};

// Collectives over the TP group (no-ops without one).
void tp_all_reduce(const OpConfig& cfg, float* data, int64_t count);

}  // namespace spindle::exec
