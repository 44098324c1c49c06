#include "libexec/ops/linear.h"

#include <cmath>

#include "libexec/ops/kernels.h"

namespace spindle::exec {

void linear_make_params(const OpConfig& cfg, uint64_t seed, ParamSet& set) {
  const int64_t in = cfg.dim("in"), out = cfg.dim("out");
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  add_param(set, "w", {in, out}, -1, 0, 1, seed, {InitKind::uniform, bound});
  add_param(set, "bias", {out}, -1, 0, 1, seed, {InitKind::zeros, 0});
}

void linear_init(LinearState& s, const OpConfig& cfg, ParamSet& params) {
  s.cfg = cfg;
  s.params = &params;
}

Tensor linear_forward(LinearState& s, const Tensor& x) {
  s.x = x;
  return linear_rows(x, s.params->params[0].value, &s.params->params[1].value);
}

Tensor linear_backward(LinearState& s, const Tensor& dy) {
  Param& w = s.params->params[0];
  Param& b = s.params->params[1];
  return linear_rows_backward(s.x, w.value, dy, w.grad, &b.grad, true);
}

}  // namespace spindle::exec
