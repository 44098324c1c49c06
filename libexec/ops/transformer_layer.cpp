#include "libexec/ops/transformer_layer.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

namespace spindle::exec {

namespace {
// Positions in ParamSet::params.
enum : size_t { LN1_G, LN1_B, W_Q, B_Q, W_K, B_K, W_V, B_V, W_O, B_O, LN2_G, LN2_B, W_1, B_1, W_2, B_2 };

void check_layer_dims(const OpConfig& cfg) {
  const int64_t h = cfg.dim("hidden"), heads = cfg.dim("heads"), f = cfg.dim("ffn");
  const int k = cfg.tp_size;
  if (heads <= 0 || h % heads != 0 || heads % k != 0 || f % k != 0)
    throw std::invalid_argument("transformer_layer: heads must divide hidden and tensor_parallel "
                                "must divide heads and ffn: " + cfg.dims.dump() +
                                " tp=" + std::to_string(k));
}

void add_bias_rows(Tensor& y, const Tensor& b) {
  const int64_t w = b.numel();
  y.mat(y.numel() / w, w).rowwise() += b.row_vec();
}
}  // namespace

// LayerNorm gains 1, every bias and LayerNorm bias 0, the weights uniform
// in +-1/sqrt(fan-in): h for q, k, v, o and w_1, ffn for w_2.
InitSpec transformer_layer_param_init(const OpConfig& cfg, const std::string& tensor) {
  check_layer_dims(cfg);
  if (tensor == "ln1_g" || tensor == "ln2_g") return {InitKind::ones, 0};
  if (tensor.rfind("w_", 0) != 0) return {InitKind::zeros, 0};
  const int64_t fan_in = tensor == "w_2" ? cfg.dim("ffn") : cfg.dim("hidden");
  return {InitKind::uniform, 1.0f / std::sqrt(static_cast<float>(fan_in))};
}

void transformer_layer_init(TransformerLayerState& s, const OpConfig& cfg, ParamSet& params) {
  check_layer_dims(cfg);
  s.cfg = cfg;
  s.params = &params;
  s.hidden = cfg.dim("hidden");
  s.heads = cfg.dim("heads");
  s.ffn = cfg.dim("ffn");
  s.causal = cfg.flag("causal", false);
}

Tensor transformer_layer_forward(TransformerLayerState& s, const Tensor& x) {
  std::vector<Param>& p = s.params->params;
  const int64_t b = x.size(0), seq = x.size(1), h = s.hidden, n = b * seq;
  const int64_t lheads = s.heads / s.cfg.tp_size, dh = h / s.heads, hl = lheads * dh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));

  // Attention over this rank's heads.
  s.xn1 = layernorm_forward(x, p[LN1_G].value, p[LN1_B].value, s.ln1);
  s.q = linear_rows(s.xn1, p[W_Q].value, &p[B_Q].value);
  s.k = linear_rows(s.xn1, p[W_K].value, &p[B_K].value);
  s.v = linear_rows(s.xn1, p[W_V].value, &p[B_V].value);
  s.probs = Tensor::zeros({b, lheads, seq, seq});
  s.attn = Tensor::zeros({b, seq, hl});
  ConstMatMap q = std::as_const(s.q).mat(n, hl), k = std::as_const(s.k).mat(n, hl),
              v = std::as_const(s.v).mat(n, hl);
  MatMap attn = s.attn.mat(n, hl);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t j = 0; j < lheads; ++j) {
      MatMap pm(s.probs.data() + (bi * lheads + j) * seq * seq, seq, seq);
      pm.noalias() = q.block(bi * seq, j * dh, seq, dh) * k.block(bi * seq, j * dh, seq, dh).transpose();
      pm *= scale;
      if (s.causal)
        for (int64_t r = 0; r < seq; ++r)
          pm.row(r).tail(seq - r - 1).setConstant(-std::numeric_limits<float>::infinity());
      for (int64_t r = 0; r < seq; ++r) {
        pm.row(r) = (pm.row(r).array() - pm.row(r).maxCoeff()).exp().matrix();
        pm.row(r) /= pm.row(r).sum();
      }
      attn.block(bi * seq, j * dh, seq, dh).noalias() = pm * v.block(bi * seq, j * dh, seq, dh);
    }
  }
  Tensor x1 = linear_rows(s.attn, p[W_O].value, nullptr);  // partial sum under TP
  tp_all_reduce(s.cfg, x1.data(), x1.numel());
  add_bias_rows(x1, p[B_O].value);
  add_into(x1, x);

  // MLP over this rank's ffn columns.
  s.xn2 = layernorm_forward(x1, p[LN2_G].value, p[LN2_B].value, s.ln2);
  s.h1 = linear_rows(s.xn2, p[W_1].value, &p[B_1].value);
  s.a1 = gelu_forward(s.h1);
  Tensor y = linear_rows(s.a1, p[W_2].value, nullptr);  // partial sum under TP
  tp_all_reduce(s.cfg, y.data(), y.numel());
  add_bias_rows(y, p[B_2].value);
  add_into(y, x1);
  return y;
}

Tensor transformer_layer_backward(TransformerLayerState& s, const Tensor& dy) {
  std::vector<Param>& p = s.params->params;
  const int64_t b = dy.size(0), seq = dy.size(1), h = s.hidden, n = b * seq;
  const int64_t lheads = s.heads / s.cfg.tp_size, dh = h / s.heads, hl = lheads * dh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));

  // MLP (b_2's gradient is the column sum of dy).
  Tensor da1 = linear_rows_backward(s.a1, p[W_2].value, dy, p[W_2].grad, &p[B_2].grad, true);
  Tensor dh1 = gelu_backward(s.h1, da1);
  Tensor dxn2 = linear_rows_backward(s.xn2, p[W_1].value, dh1, p[W_1].grad, &p[B_1].grad, true);
  tp_all_reduce(s.cfg, dxn2.data(), dxn2.numel());
  Tensor dx1 = layernorm_backward(dxn2, p[LN2_G].value, s.ln2, p[LN2_G].grad, p[LN2_B].grad);
  add_into(dx1, dy);

  // Attention.
  Tensor dattn = linear_rows_backward(s.attn, p[W_O].value, dx1, p[W_O].grad, &p[B_O].grad, true);
  Tensor dq = Tensor::zeros(s.q.shape()), dk = Tensor::zeros(s.k.shape()), dv = Tensor::zeros(s.v.shape());
  ConstMatMap q = std::as_const(s.q).mat(n, hl), k = std::as_const(s.k).mat(n, hl),
              v = std::as_const(s.v).mat(n, hl), da = std::as_const(dattn).mat(n, hl);
  MatMap dqm = dq.mat(n, hl), dkm = dk.mat(n, hl), dvm = dv.mat(n, hl);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t j = 0; j < lheads; ++j) {
      ConstMatMap pm(s.probs.data() + (bi * lheads + j) * seq * seq, seq, seq);
      const auto blk = [&](auto& m) { return m.block(bi * seq, j * dh, seq, dh); };
      blk(dvm).noalias() = pm.transpose() * blk(da);
      MatrixRM dp = blk(da) * blk(v).transpose();
      const Eigen::VectorXf rowdot = (dp.array() * pm.array()).rowwise().sum();
      MatrixRM ds = (pm.array() * (dp.array().colwise() - rowdot.array())).matrix() * scale;
      blk(dqm).noalias() = ds * blk(k);
      blk(dkm).noalias() = ds.transpose() * blk(q);
    }
  }
  Tensor dxn1 = linear_rows_backward(s.xn1, p[W_Q].value, dq, p[W_Q].grad, &p[B_Q].grad, true);
  // b_k's exact gradient is 0 (a bias shared by every key shifts each query's
  // scores by a constant, which the softmax ignores); computing the column sum
  // of dk would leave only rounding noise, which AdamW turns into +-lr steps
  // that differ between device counts. Its gradient stays 0.
  add_into(dxn1, linear_rows_backward(s.xn1, p[W_K].value, dk, p[W_K].grad, nullptr, true));
  add_into(dxn1, linear_rows_backward(s.xn1, p[W_V].value, dv, p[W_V].grad, &p[B_V].grad, true));
  tp_all_reduce(s.cfg, dxn1.data(), dxn1.numel());
  Tensor dx = layernorm_backward(dxn1, p[LN1_G].value, s.ln1, p[LN1_G].grad, p[LN1_B].grad);
  add_into(dx, dx1);
  return dx;
}

}  // namespace spindle::exec
