#include "libexec/ops/lm_loss.h"

#include <cmath>
#include <stdexcept>

namespace spindle::exec {

namespace {
void check_loss_dims(const OpConfig& cfg) {
  if (cfg.dim("vocab") % cfg.tp_size != 0)
    throw std::invalid_argument("lm_loss: tensor_parallel " + std::to_string(cfg.tp_size) +
                                " does not divide vocab " + std::to_string(cfg.dim("vocab")));
}

constexpr float kIgnored = -1.0f;

// The target id, or -1 for an ignored position.
int64_t target_id(float v, int64_t vocab) {
  if (v == kIgnored) return -1;
  const auto id = static_cast<int64_t>(v);
  if (id < 0 || id >= vocab || static_cast<float>(id) != v)
    throw std::out_of_range("lm_loss: target " + std::to_string(v) + " outside the vocabulary");
  return id;
}
}  // namespace

InitSpec lm_loss_param_init(const OpConfig& cfg, const std::string& tensor) {
  check_loss_dims(cfg);
  if (tensor == "ln_g") return {InitKind::ones, 0};
  if (tensor == "ln_b") return {InitKind::zeros, 0};
  return {InitKind::uniform, 1.0f / std::sqrt(static_cast<float>(cfg.dim("hidden")))};
}

void lm_loss_init(LmLossState& s, const OpConfig& cfg, ParamSet& params) {
  check_loss_dims(cfg);
  s.cfg = cfg;
  s.params = &params;
  s.vocab = cfg.dim("vocab");
}

Tensor lm_loss_forward(LmLossState& s, const Tensor& x, const Tensor& targets) {
  std::vector<Param>& p = s.params->params;
  const int64_t h = x.shape().back(), n = x.numel() / h, k = s.cfg.tp_size;
  const int64_t vl = s.vocab / k, first = s.cfg.tp_rank * vl;
  if (targets.numel() != n) throw std::invalid_argument("lm_loss: one target per token expected");
  s.targets = targets;
  s.z = layernorm_forward(x, p[0].value, p[1].value, s.ln);
  // The logits, made the probabilities in place below: one [n, vocab/K]
  // buffer, the largest this operator makes (memory_as_run counts one).
  s.probs = linear_rows(s.z, p[2].value, nullptr).reshaped({n, vl});
  MatMap lg = s.probs.mat(n, vl);

  // Row maxima over the whole vocabulary.
  Eigen::VectorXf mx = lg.rowwise().maxCoeff();
  if (k > 1) {
    Eigen::VectorXf all(n * k);
    s.cfg.tp->all_gather({mx.data(), static_cast<size_t>(n)}, {all.data(), static_cast<size_t>(n * k)});
    mx = all.segment(0, n);  // the same shift on every rank
    for (int64_t r = 1; r < k; ++r) mx = mx.cwiseMax(all.segment(r * n, n));
  }
  // Sums of exponentials [0, n) and target logits [n, 2n), summed over the
  // group; each row's target logit is read before its row is exponentiated.
  std::vector<float> red(static_cast<size_t>(2 * n), 0.0f);
  MatMap pr = lg;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = target_id(targets[i], s.vocab) - first;
    if (t >= 0 && t < vl) red[static_cast<size_t>(n + i)] = lg(i, t);
    pr.row(i) = (lg.row(i).array() - mx[i]).exp().matrix();
    red[static_cast<size_t>(i)] = pr.row(i).sum();
  }
  tp_all_reduce(s.cfg, red.data(), 2 * n);
  double loss = 0;
  s.counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float sum = red[static_cast<size_t>(i)];
    pr.row(i) /= sum;
    if (targets[i] == kIgnored) continue;
    loss += std::log(static_cast<double>(sum)) + mx[i] - red[static_cast<size_t>(n + i)];
    ++s.counted;
  }
  return Tensor::from({1}, {s.counted > 0 ? static_cast<float>(loss / static_cast<double>(s.counted)) : 0.0f});
}

Tensor lm_loss_backward(LmLossState& s, const Tensor& dloss) {
  std::vector<Param>& p = s.params->params;
  const int64_t n = s.probs.size(0), vl = s.probs.size(1), first = s.cfg.tp_rank * vl;
  // dL/dlogits = g/n * (softmax - onehot(target)) for counted tokens, 0 for
  // ignored ones; local columns. Made in the probabilities' buffer, which
  // backward is their last reader of: no second [n, vocab/K] tensor.
  Tensor dlogits = std::move(s.probs);
  s.probs = Tensor();
  MatMap dl = dlogits.mat(n, vl);
  for (int64_t i = 0; i < n; ++i) {
    if (s.targets[i] == kIgnored) {
      dl.row(i).setZero();
      continue;
    }
    const int64_t t = target_id(s.targets[i], s.vocab) - first;
    if (t >= 0 && t < vl) dl(i, t) -= 1.0f;
  }
  dl *= s.counted > 0 ? dloss[0] / static_cast<float>(s.counted) : 0.0f;
  Tensor dz = linear_rows_backward(s.z, p[2].value, dlogits.reshaped(with_last(s.z.shape(), vl)),
                                   p[2].grad, nullptr, true);
  tp_all_reduce(s.cfg, dz.data(), dz.numel());
  return layernorm_backward(dz, p[0].value, s.ln, p[0].grad, p[1].grad);
}

}  // namespace spindle::exec
