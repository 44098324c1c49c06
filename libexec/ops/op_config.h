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
  Comm* tp = nullptr;    // tensor-parallel group (not owned); nullptr = no TP

  int tp_rank() const { return tp ? tp->rank() : 0; }
  int tp_size() const { return tp ? tp->size() : 1; }
  int64_t dim(const char* name) const;   // integer dim; throws std::invalid_argument if absent
  bool flag(const char* name, bool default_value) const;
  double real(const char* name, double default_value) const;
};

// Collectives over the TP group (no-ops without one).
void tp_all_reduce(const OpConfig& cfg, float* data, int64_t count);

}  // namespace spindle::exec
