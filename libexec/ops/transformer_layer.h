// transformer_layer: [b, s, hidden] -> same. Pre-LayerNorm block:
//   x1 = x + Attn(LN1(x)),  y = x1 + W2 GELU(W1 LN2(x1) + b1) + b2
// Attn: multi-head self-attention (heads of width hidden/heads, scores
// scaled by 1/sqrt(head width), optional causal mask), output projection
// W_o with bias b_o. GELU is the tanh approximation.
//
// Parameters (4*hidden^2 + 2*hidden*ffn + ffn + 9*hidden), W as [in, out]:
//   ln1_g, ln1_b [hidden]; w_q, w_k, w_v [hidden, hidden]; b_q, b_k, b_v
//   [hidden]; w_o [hidden, hidden]; b_o [hidden]; ln2_g, ln2_b [hidden];
//   w_1 [hidden, ffn]; b_1 [ffn]; w_2 [ffn, hidden]; b_2 [hidden].
//
// Tensor parallel over cfg.tp (K ranks, Megatron-style): rank t holds heads
// [t*heads/K, (t+1)*heads/K): columns of w_q, w_k, w_v, b_*; rows of w_o;
// columns t of K of w_1, b_1 and rows of w_2. LayerNorms, b_o and b_2 are
// replicated. Forward all-reduces the partial outputs of w_o and w_2;
// backward all-reduces the partial gradients at the inputs of the two
// LayerNorm outputs. Every rank of the group passes the same x and gets the
// same y and dx; K ranks give the single-device result up to reordering.
#pragma once

#include "libexec/ops/kernels.h"
#include "libexec/ops/op_config.h"
#include "libexec/ops/param.h"

namespace spindle::exec {

struct TransformerLayerState {
  OpConfig cfg;
  ParamSet* params = nullptr;  // not owned
  int64_t hidden = 0, heads = 0, ffn = 0;
  bool causal = false;
  // Saved by forward for backward (local widths: hl = hidden/K, fl = ffn/K).
  LayerNormCache ln1, ln2;
  Tensor xn1, xn2;      // LayerNorm outputs [b, s, hidden]
  Tensor q, k, v;       // [b, s, hl]
  Tensor probs;         // attention probabilities [b, heads/K, s, s]
  Tensor attn;          // concatenated head outputs [b, s, hl]
  Tensor h1, a1;        // MLP pre- and post-GELU [b, s, fl]
};

// The initialisation of its parameter tensor `tensor` (a name of
// plan::op_param_tensors for this op; make_params allocates them).
InitSpec transformer_layer_param_init(const OpConfig& cfg, const std::string& tensor);
// Throws std::invalid_argument when heads does not divide hidden or the TP
// size does not divide heads and ffn.
void transformer_layer_init(TransformerLayerState& s, const OpConfig& cfg, ParamSet& params);
Tensor transformer_layer_forward(TransformerLayerState& s, const Tensor& x);
// Adds parameter gradients (local shards); returns dL/dx.
Tensor transformer_layer_backward(TransformerLayerState& s, const Tensor& dy);

}  // namespace spindle::exec
