#include "libexec/ops/patch_embed.h"

#include <cmath>
#include <stdexcept>

#include "libexec/ops/kernels.h"

namespace spindle::exec {

InitSpec patch_embed_param_init(const OpConfig& cfg, const std::string& tensor) {
  if (tensor == "bias") return {InitKind::zeros, 0};
  if (tensor == "pos") return {InitKind::normal, 0.02f};
  return {InitKind::uniform, 1.0f / std::sqrt(static_cast<float>(cfg.dim("in_dim")))};
}

void patch_embed_init(PatchEmbedState& s, const OpConfig& cfg, ParamSet& params) {
  s.cfg = cfg;
  s.params = &params;
}

Tensor patch_embed_forward(PatchEmbedState& s, const Tensor& x) {
  const Tensor& pos = s.params->params[2].value;
  const int64_t b = x.size(0), seq = x.size(1), h = pos.size(1);
  if (seq > pos.size(0)) throw std::invalid_argument("patch_embed: seq beyond the position table");
  s.x = x;
  Tensor y = linear_rows(x, s.params->params[0].value, &s.params->params[1].value);
  for (int64_t i = 0; i < b; ++i) y.mat(b * seq, h).middleRows(i * seq, seq) += pos.mat(pos.size(0), h).topRows(seq);
  return y;
}

void patch_embed_backward(PatchEmbedState& s, const Tensor& dy) {
  Param& w = s.params->params[0];
  Param& bias = s.params->params[1];
  Param& pos = s.params->params[2];
  const int64_t b = dy.size(0), seq = dy.size(1), h = dy.size(2);
  linear_rows_backward(s.x, w.value, dy, w.grad, &bias.grad, false);
  for (int64_t i = 0; i < b; ++i)
    pos.grad.mat(pos.grad.size(0), h).topRows(seq) += dy.mat(b * seq, h).middleRows(i * seq, seq);
}

}  // namespace spindle::exec
