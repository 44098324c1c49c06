#include "libexec/ops/contrastive_loss.h"

#include <cmath>
#include <stdexcept>

namespace spindle::exec {

void contrastive_loss_init(ContrastiveLossState& s, const OpConfig& cfg) {
  s.cfg = cfg;
  s.temperature = static_cast<float>(cfg.real("temperature", 0.07));
}

namespace {
// Row-normalises x [B, d] into u; returns the norms.
Tensor normalise(const Tensor& x, Tensor& u) {
  const int64_t bsz = x.size(0), d = x.numel() / bsz;
  u = Tensor::zeros({bsz, d});
  Tensor norm = Tensor::zeros({bsz});
  for (int64_t i = 0; i < bsz; ++i) {
    norm[i] = x.mat(bsz, d).row(i).norm();
    u.mat(bsz, d).row(i) = x.mat(bsz, d).row(i) / norm[i];
  }
  return norm;
}

// Softmax of each row of m, in place; returns the sum of -log p[i][i].
double softmax_rows_diag_nll(MatrixRM& m) {
  double nll = 0;
  for (int64_t i = 0; i < m.rows(); ++i) {
    const float mx = m.row(i).maxCoeff();
    const float diag = m(i, i) - mx;
    m.row(i) = (m.row(i).array() - mx).exp().matrix();
    const float sum = m.row(i).sum();
    nll += std::log(static_cast<double>(sum)) - static_cast<double>(diag);
    m.row(i) /= sum;
  }
  return nll;
}
}  // namespace

Tensor contrastive_loss_forward(ContrastiveLossState& s, const Tensor& a, const Tensor& b) {
  const int64_t bsz = a.size(0);
  if (b.size(0) != bsz || a.numel() != b.numel())
    throw std::invalid_argument("contrastive_loss: inputs " + shape_str(a.shape()) + " and " +
                                shape_str(b.shape()) + " differ");
  const int64_t d = a.numel() / bsz;
  s.norm_a = normalise(a, s.u);
  s.norm_b = normalise(b, s.w);
  MatrixRM logits = s.u.mat(bsz, d) * s.w.mat(bsz, d).transpose() / s.temperature;
  MatrixRM rows = logits;
  MatrixRM cols = logits.transpose();
  const double loss = 0.5 * (softmax_rows_diag_nll(rows) + softmax_rows_diag_nll(cols)) /
                      static_cast<double>(bsz);
  s.probs_rows = Tensor::zeros({bsz, bsz});
  s.probs_rows.mat(bsz, bsz) = rows;
  s.probs_cols = Tensor::zeros({bsz, bsz});
  s.probs_cols.mat(bsz, bsz) = cols.transpose();
  return Tensor::from({1}, {static_cast<float>(loss)});
}

std::array<Tensor, 2> contrastive_loss_backward(ContrastiveLossState& s, const Tensor& dloss) {
  const int64_t bsz = s.u.size(0), d = s.u.size(1);
  // dL/dlogits = g/(2B) * (P_rows - I + P_cols - I).
  const float g = dloss[0] * 0.5f / static_cast<float>(bsz);
  MatrixRM dlogits = s.probs_rows.mat(bsz, bsz) + s.probs_cols.mat(bsz, bsz);
  dlogits.diagonal().array() -= 2.0f;
  dlogits *= g / s.temperature;  // includes the 1/temperature of the logits
  const MatrixRM du = dlogits * s.w.mat(bsz, d);
  const MatrixRM dw = dlogits.transpose() * s.u.mat(bsz, d);
  // Through the normalisation: dx = (du - u (u . du)) / |x|.
  std::array<Tensor, 2> out{Tensor::zeros({bsz, 1, d}), Tensor::zeros({bsz, 1, d})};
  const Tensor* units[2] = {&s.u, &s.w};
  const Tensor* norms[2] = {&s.norm_a, &s.norm_b};
  const MatrixRM* grads[2] = {&du, &dw};
  for (int side = 0; side < 2; ++side) {
    ConstMatMap u = units[side]->mat(bsz, d);
    MatMap dx = out[static_cast<size_t>(side)].mat(bsz, d);
    for (int64_t i = 0; i < bsz; ++i) {
      const auto gi = grads[side]->row(i);
      dx.row(i) = (gi - u.row(i) * u.row(i).dot(gi)) / (*norms[side])[i];
    }
  }
  return out;
}

}  // namespace spindle::exec
