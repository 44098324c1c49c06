#include "libexec/ops/op_config.h"

#include <array>
#include <stdexcept>

namespace spindle::exec {

namespace {
constexpr std::array<std::pair<OpKind, const char*>, 7> kNames{{
    {OpKind::patch_embed, "patch_embed"},
    {OpKind::token_embed, "token_embed"},
    {OpKind::transformer_layer, "transformer_layer"},
    {OpKind::linear, "linear"},
    {OpKind::pool_project, "pool_project"},
    {OpKind::contrastive_loss, "contrastive_loss"},
    {OpKind::lm_loss, "lm_loss"},
}};
}  // namespace

std::optional<OpKind> op_kind(std::string_view name) {
  for (const auto& [kind, n] : kNames)
    if (name == n) return kind;
  return std::nullopt;
}

const char* op_name(OpKind kind) {
  for (const auto& [k, n] : kNames)
    if (k == kind) return n;
  return "?";
}

int64_t OpConfig::dim(const char* name) const {
  if (!dims.is_object() || !dims.contains(name) || !dims[name].is_number_integer())
    throw std::invalid_argument(std::string(op_name(kind)) + ": missing integer dim '" + name +
                                "' in " + dims.dump());
  return dims[name].get<int64_t>();
}

bool OpConfig::flag(const char* name, bool default_value) const {
  if (!dims.is_object() || !dims.contains(name)) return default_value;
  return dims[name].get<bool>();
}

double OpConfig::real(const char* name, double default_value) const {
  if (!dims.is_object() || !dims.contains(name)) return default_value;
  return dims[name].get<double>();
}

void OpConfig::use_tp(Comm* group) {
  tp = group;
  tp_rank = group ? group->rank() : 0;
  tp_size = group ? group->size() : 1;
}

void tp_all_reduce(const OpConfig& cfg, float* data, int64_t count) {
  if (cfg.tp && cfg.tp->size() > 1) cfg.tp->all_reduce_sum({data, static_cast<size_t>(count)});
}

}  // namespace spindle::exec
