// AdamW (Loshchilov & Hutter, decoupled weight decay), fp32 parameters and
// moments, PyTorch's order of operations. For step t >= 1, with
// g = grad * grad_scale (fp32; 1 but under gradient clipping: the clipping
// factor, as torch.nn.utils.clip_grad_norm_ scales the gradients first):
//   p <- p * (1 - lr * weight_decay)
//   m <- beta1 m + (1 - beta1) g;   v <- beta2 v + (1 - beta2) g^2
//   p <- p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
#pragma once

#include <cstdint>

#include "libexec/tensor.h"

namespace spindle::exec {

struct AdamWConfig {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  float grad_scale = 1.0f;   // gradients are multiplied by it first (spindle-run --clip-grad)
};

// The per-step scalars every AdamW implementation shares: bias corrections
// 1 - beta^t (computed in double, rounded to float) and the decay factor
// 1 - lr * weight_decay. Also checks the arguments: throws
// std::invalid_argument on step < 1 or when grad, m, v differ in size from
// param. Backends use it so that they update exactly like adamw_step.
struct AdamWScalars {
  float bc1 = 1, bc2 = 1, decay = 1;
};
AdamWScalars adamw_scalars(const AdamWConfig& cfg, int64_t step, const Tensor& param, const Tensor& grad,
                           const Tensor& m, const Tensor& v);

// m, v: moments with the shape of param, zero before step 1; updated in place.
// Throws std::invalid_argument on a size mismatch or step < 1.
void adamw_step(const AdamWConfig& cfg, int64_t step, Tensor& param, const Tensor& grad,
                Tensor& m, Tensor& v);

}  // namespace spindle::exec
