// contrastive_loss: two [B, 1, dim] -> scalar [1]. Symmetric InfoNCE on the
// FULL batch (the caller gathers every data-parallel rank's rows first, as
// distributed CLIP training does):
//   u = a/|a|, w = b/|b| (row-wise), logits = u w^T / temperature [B, B],
//   loss = (CE(rows of logits, diagonal) + CE(columns, diagonal)) / 2,
// each cross-entropy a mean over the B samples. temperature is fixed
// (dims, default 0.07): no parameters. Not split under TP.
#pragma once

#include <array>

#include "libexec/ops/op_config.h"
#include "libexec/tensor.h"

namespace spindle::exec {

struct ContrastiveLossState {
  OpConfig cfg;
  float temperature = 0.07f;
  Tensor u, w;            // normalised inputs [B, dim]
  Tensor norm_a, norm_b;  // row norms [B]
  Tensor probs_rows;      // softmax over each row of logits [B, B]
  Tensor probs_cols;      // softmax over each column of logits [B, B]
};

void contrastive_loss_init(ContrastiveLossState& s, const OpConfig& cfg);
Tensor contrastive_loss_forward(ContrastiveLossState& s, const Tensor& a, const Tensor& b);
// dloss: [1], dL/dloss (e.g. the task weight). Returns {dL/da, dL/db}, full batch.
std::array<Tensor, 2> contrastive_loss_backward(ContrastiveLossState& s, const Tensor& dloss);

}  // namespace spindle::exec
