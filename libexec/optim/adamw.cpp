#include "libexec/optim/adamw.h"

#include <cmath>
#include <stdexcept>

namespace spindle::exec {

AdamWScalars adamw_scalars(const AdamWConfig& cfg, int64_t step, const Tensor& param, const Tensor& grad,
                           const Tensor& m, const Tensor& v) {
  if (step < 1) throw std::invalid_argument("adamw_step: step counts from 1");
  const int64_t n = param.numel();
  if (grad.numel() != n || m.numel() != n || v.numel() != n)
    throw std::invalid_argument("adamw_step: parameter, gradient and moments differ in size");
  const double t = static_cast<double>(step);
  AdamWScalars k;
  k.bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(cfg.beta1), t));
  k.bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(cfg.beta2), t));
  k.decay = 1.0f - cfg.lr * cfg.weight_decay;
  return k;
}

void adamw_step(const AdamWConfig& cfg, int64_t step, Tensor& param, const Tensor& grad,
                Tensor& m, Tensor& v) {
  const auto [bc1, bc2, decay] = adamw_scalars(cfg, step, param, grad, m, v);
  const int64_t n = param.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * cfg.grad_scale;
    m[i] = cfg.beta1 * m[i] + (1.0f - cfg.beta1) * g;
    v[i] = cfg.beta2 * v[i] + (1.0f - cfg.beta2) * g * g;
    param[i] = param[i] * decay - cfg.lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + cfg.eps);
  }
}

}  // namespace spindle::exec
