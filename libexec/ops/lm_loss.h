// lm_loss: [b, s, hidden] hidden states and [b, s] targets (fp32 holding
// ids in 0..vocab-1, or -1: position ignored) -> scalar [1]: LayerNorm,
// linear to vocab (no bias), mean over the n counted tokens (targets not
// -1) of the softmax cross-entropy against the targets; 0 when n = 0.
// Ignored positions get no gradient.
// Parameters: ln_g, ln_b [hidden]; w [hidden, vocab] (hidden*vocab + 2*hidden).
//
// Tensor parallel over cfg.tp (K ranks, vocab-parallel): rank t holds
// columns [t*vocab/K, (t+1)*vocab/K) of w and computes only those logits;
// the softmax is distributed (max by all-gather, sum of exponentials and the
// target logit by all-reduce), and backward all-reduces the gradient at the
// LayerNorm output. Every rank of the group passes the same inputs and gets
// the same loss and dx.
#pragma once

#include "libexec/ops/kernels.h"
#include "libexec/ops/op_config.h"
#include "libexec/ops/param.h"

namespace spindle::exec {

struct LmLossState {
  OpConfig cfg;
  ParamSet* params = nullptr;  // not owned
  int64_t vocab = 0;
  LayerNormCache ln;
  Tensor z;        // LayerNorm output [b, s, hidden]
  Tensor probs;    // softmax over the full vocabulary, local columns [b*s, vocab/K]
  Tensor targets;  // saved input [b, s]
  int64_t counted = 0;  // tokens whose target is not -1
};

// The initialisation of its parameter tensor `tensor` (a name of
// plan::op_param_tensors for this op; make_params allocates them).
InitSpec lm_loss_param_init(const OpConfig& cfg, const std::string& tensor);
// Throws std::invalid_argument when the TP size does not divide vocab.
void lm_loss_init(LmLossState& s, const OpConfig& cfg, ParamSet& params);
// Throws std::out_of_range for a target outside the vocabulary (and not -1).
Tensor lm_loss_forward(LmLossState& s, const Tensor& x, const Tensor& targets);
// dloss: [1], dL/dloss. Adds parameter gradients; returns dL/dx.
Tensor lm_loss_backward(LmLossState& s, const Tensor& dloss);

}  // namespace spindle::exec
