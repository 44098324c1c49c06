#include "libexec/ops/kernels.h"

#include <cmath>
#include <stdexcept>

namespace spindle::exec {

Shape with_last(Shape shape, int64_t w) {
  if (shape.empty()) throw std::invalid_argument("with_last on a scalar shape");
  shape.back() = w;
  return shape;
}

Tensor linear_rows(const Tensor& x, const Tensor& w, const Tensor* b) {
  const int64_t in = w.size(0), out = w.size(1);
  if (x.shape().back() != in)
    throw std::invalid_argument("linear: input " + shape_str(x.shape()) + " vs weight " +
                                shape_str(w.shape()));
  const int64_t rows = x.numel() / in;
  Tensor y = Tensor::zeros(with_last(x.shape(), out));
  MatMap ym = y.mat(rows, out);
  ym.noalias() = x.mat(rows, in) * w.mat(in, out);
  if (b) ym.rowwise() += b->row_vec();
  return y;
}

Tensor linear_rows_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dw,
                            Tensor* db, bool want_dx) {
  const int64_t in = w.size(0), out = w.size(1), rows = x.numel() / in;
  ConstMatMap dym = dy.mat(rows, out);
  dw.mat(in, out).noalias() += x.mat(rows, in).transpose() * dym;
  // Column sums through a temporary: added straight into db, Eigen's
  // vectorised loop would start at db's first 16-byte boundary and sum the
  // columns before it another way, so the gradient's rounding would depend
  // on where db lies (a view into its bucket's flat buffer, at the offset
  // the bucket layout gives it). The temporary is always aligned.
  if (db) db->row_vec() += Eigen::RowVectorXf(dym.colwise().sum());
  if (!want_dx) return {};
  Tensor dx = Tensor::zeros(x.shape());
  dx.mat(rows, in).noalias() = dym * w.mat(in, out).transpose();
  return dx;
}

Tensor layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                         LayerNormCache& cache) {
  const int64_t w = x.shape().back(), rows = x.numel() / w;
  cache.xhat = Tensor::zeros(x.shape());
  cache.rstd = Tensor::zeros({rows});
  Tensor y = Tensor::zeros(x.shape());
  ConstMatMap xm = x.mat(rows, w);
  MatMap xh = cache.xhat.mat(rows, w), ym = y.mat(rows, w);
  for (int64_t r = 0; r < rows; ++r) {
    const float mean = xm.row(r).mean();
    const float var = (xm.row(r).array() - mean).square().mean();
    const float rstd = 1.0f / std::sqrt(var + kLayerNormEps);
    cache.rstd[r] = rstd;
    xh.row(r) = (xm.row(r).array() - mean) * rstd;
  }
  ym = (xh.array().rowwise() * gamma.row_vec().array()).rowwise() + beta.row_vec().array();
  return y;
}

Tensor layernorm_backward(const Tensor& dy, const Tensor& gamma, const LayerNormCache& cache,
                          Tensor& dgamma, Tensor& dbeta) {
  const int64_t w = dy.shape().back(), rows = dy.numel() / w;
  ConstMatMap dym = dy.mat(rows, w), xh = cache.xhat.mat(rows, w);
  // Through temporaries, as linear_rows_backward's bias: the same bits
  // wherever dgamma and dbeta lie.
  dgamma.row_vec() += Eigen::RowVectorXf((dym.array() * xh.array()).colwise().sum().matrix());
  dbeta.row_vec() += Eigen::RowVectorXf(dym.colwise().sum());
  Tensor dx = Tensor::zeros(dy.shape());
  MatMap dxm = dx.mat(rows, w);
  const MatrixRM dxhat = (dym.array().rowwise() * gamma.row_vec().array()).matrix();
  for (int64_t r = 0; r < rows; ++r) {
    const float m1 = dxhat.row(r).mean();
    const float m2 = dxhat.row(r).dot(xh.row(r)) / static_cast<float>(w);
    dxm.row(r) = cache.rstd[r] * (dxhat.row(r).array() - m1 - xh.row(r).array() * m2);
  }
  return dx;
}

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

// GELU and its derivative over an array, the one place of the formula:
// tanh as Eigen computes it for floats (a rational approximation within a
// few ulp of std::tanh), vectorised over a tensor (std::tanh per value was
// a third of a CPU training step). One value goes through the same
// expression, so it does not depend on where it sits in its tensor (the
// rows a device holds).
template <typename A>
Eigen::ArrayXf gelu_of(const Eigen::ArrayBase<A>& x) {
  return 0.5f * x * (1.0f + (kGeluC * (x + kGeluA * x * x * x)).tanh());
}

template <typename A>
Eigen::ArrayXf gelu_grad_of(const Eigen::ArrayBase<A>& x) {
  const Eigen::ArrayXf t = (kGeluC * (x + kGeluA * x * x * x)).tanh();
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * x * x);
}

float gelu(float x) { return gelu_of(Eigen::ArrayXf::Constant(1, x))(0); }

float gelu_grad(float x) { return gelu_grad_of(Eigen::ArrayXf::Constant(1, x))(0); }

Tensor gelu_forward(const Tensor& x) {
  Tensor y = Tensor::zeros(x.shape());
  y.vec().array() = gelu_of(x.vec().array());
  return y;
}

Tensor gelu_backward(const Tensor& x, const Tensor& dy) {
  Tensor dx = Tensor::zeros(x.shape());
  dx.vec().array() = dy.vec().array() * gelu_grad_of(x.vec().array());
  return dx;
}

void add_into(Tensor& dst, const Tensor& src) {
  if (dst.numel() != src.numel()) throw std::invalid_argument("add_into: sizes differ");
  dst.vec() += src.vec();
}

}  // namespace spindle::exec
