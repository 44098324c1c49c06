#include "libexec/ops/token_embed.h"

#include <stdexcept>

namespace spindle::exec {

InitSpec token_embed_param_init(const OpConfig&, const std::string&) {
  return {InitKind::normal, 0.02f};   // the table and the positions
}

void token_embed_init(TokenEmbedState& s, const OpConfig& cfg, ParamSet& params) {
  s.cfg = cfg;
  s.params = &params;
}

namespace {
int64_t token_id(float v, int64_t vocab) {
  const auto id = static_cast<int64_t>(v);
  if (id < 0 || id >= vocab || static_cast<float>(id) != v)
    throw std::out_of_range("token_embed: id " + std::to_string(v) + " outside the vocabulary");
  return id;
}
}  // namespace

Tensor token_embed_forward(TokenEmbedState& s, const Tensor& ids) {
  const Tensor& table = s.params->params[0].value;
  const Tensor& pos = s.params->params[1].value;
  const int64_t b = ids.size(0), seq = ids.size(1), v = table.size(0), h = table.size(1);
  if (seq > pos.size(0)) throw std::invalid_argument("token_embed: seq beyond the position table");
  s.ids = ids;
  Tensor y = Tensor::zeros({b, seq, h});
  MatMap ym = y.mat(b * seq, h);
  ConstMatMap tm = table.mat(v, h), pm = pos.mat(pos.size(0), h);
  for (int64_t r = 0; r < b * seq; ++r) ym.row(r) = tm.row(token_id(ids[r], v)) + pm.row(r % seq);
  return y;
}

void token_embed_backward(TokenEmbedState& s, const Tensor& dy) {
  Param& table = s.params->params[0];
  Param& pos = s.params->params[1];
  const int64_t b = s.ids.size(0), seq = s.ids.size(1), v = table.value.size(0), h = table.value.size(1);
  MatMap dt = table.grad.mat(v, h), dp = pos.grad.mat(pos.grad.size(0), h);
  ConstMatMap dym = dy.mat(b * seq, h);
  for (int64_t r = 0; r < b * seq; ++r) {
    dt.row(token_id(s.ids[r], v)) += dym.row(r);
    dp.row(r % seq) += dym.row(r);
  }
}

}  // namespace spindle::exec
