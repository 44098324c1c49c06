// Building blocks shared by the CPU operators (host tensors, fp32, Eigen for
// every matrix product). A tensor of shape [..., w] is seen as a matrix of
// numel / w rows and w columns.
#pragma once

#include <cstdint>

#include "libexec/tensor.h"

namespace spindle::exec {

inline constexpr float kLayerNormEps = 1e-5f;

// `shape` with its last dimension replaced by `w`.
Shape with_last(Shape shape, int64_t w);

// y = x W (+ b): x [..., in], w [in, out], b [out] or nullptr -> [..., out].
Tensor linear_rows(const Tensor& x, const Tensor& w, const Tensor* b);
// Backward of linear_rows given dy [..., out]: dw += x^T dy; db += column
// sums of dy (when db); returns dx = dy W^T (empty when !want_dx).
Tensor linear_rows_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dw,
                            Tensor* db, bool want_dx);

// LayerNorm over the last dimension, eps kLayerNormEps.
struct LayerNormCache {
  Tensor xhat;  // (x - mean) * rstd, shape of x
  Tensor rstd;  // [rows]
};
Tensor layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                         LayerNormCache& cache);
// Returns dx; adds into dgamma, dbeta.
Tensor layernorm_backward(const Tensor& dy, const Tensor& gamma, const LayerNormCache& cache,
                          Tensor& dgamma, Tensor& dbeta);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
float gelu(float x);
float gelu_grad(float x);  // d gelu / dx
Tensor gelu_forward(const Tensor& x);
Tensor gelu_backward(const Tensor& x, const Tensor& dy);  // dy * gelu'(x)

// Adds `src` into `dst` elementwise (same element count).
void add_into(Tensor& dst, const Tensor& src);

}  // namespace spindle::exec
