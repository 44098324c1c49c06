#include "libexec/ops/linear.h"

#include <cmath>

#include "libexec/ops/kernels.h"

namespace spindle::exec {

InitSpec linear_param_init(const OpConfig& cfg, const std::string& tensor) {
  if (tensor == "bias") return {InitKind::zeros, 0};
  return {InitKind::uniform, 1.0f / std::sqrt(static_cast<float>(cfg.dim("in")))};
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
