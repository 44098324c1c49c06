// One operator instance of the runtime, whatever its kind, and the switch
// that dispatches on the kind (docs/architecture.md, convention 7). Each kind's state struct and
// init/forward/backward functions live in their own file pair beside this.
//
// Inputs and outputs per kind (b: local batch, s: the operator's seq):
//   patch_embed        {features [b,s,in_dim]}        -> [b,s,hidden]   grads: {}
//   token_embed        {ids [b,s]}                    -> [b,s,hidden]   grads: {}
//   transformer_layer  {x [b,s,hidden]}               -> [b,s,hidden]   grads: {dx}
//   linear             {x [b,s,in]}                   -> [b,s,out]      grads: {dx}
//   pool_project       {x [b,s,in]}                   -> [b,1,out]      grads: {dx}
//   contrastive_loss   {a [B,1,d], b [B,1,d]} (B: the FULL batch) -> [1]  grads: {da, db}
//   lm_loss            {x [b,s,hidden], targets [b,s]} -> [1] (mean over b*s) grads: {dx}
// A loss's backward takes dL/dloss as a [1] tensor. Backward must follow the
// forward of the same Op (it uses what forward saved) and adds into the
// parameters' grad tensors.
#pragma once

#include <span>
#include <variant>
#include <vector>

#include "libexec/ops/contrastive_loss.h"
#include "libexec/ops/linear.h"
#include "libexec/ops/lm_loss.h"
#include "libexec/ops/op_config.h"
#include "libexec/ops/param.h"
#include "libexec/ops/patch_embed.h"
#include "libexec/ops/pool_project.h"
#include "libexec/ops/token_embed.h"
#include "libexec/ops/transformer_layer.h"

namespace spindle::exec {

struct Op {
  OpKind kind = OpKind::linear;
  std::variant<PatchEmbedState, TokenEmbedState, TransformerLayerState, LinearState,
               PoolProjectState, ContrastiveLossState, LmLossState>
      state;
};

// The parameters of one "M/k.r" for `cfg` (local TP shards), initialised
// from (seed, parameter name) on `threads` host threads (the values do not
// depend on it). `name` is "M/k.r". Empty for contrastive_loss.
ParamSet make_params(const OpConfig& cfg, const std::string& name, uint64_t seed, int threads = 1);

// An operator bound to `params` (made by make_params with the same cfg; must
// outlive the Op). Throws std::invalid_argument on inconsistent dims.
Op make_op(const OpConfig& cfg, ParamSet& params);

// Number of inputs forward takes (1, or 2 for contrastive_loss and lm_loss).
int op_input_count(OpKind kind);

// CPU implementations (host tensors): see the table above.
Tensor op_forward(Op& op, std::span<const Tensor> inputs);
std::vector<Tensor> op_backward(Op& op, const Tensor& grad_output);
// Drops the tensors forward saved for backward, keeping the op's
// configuration and parameters: the CPU backend calls it after an op's
// backward, so that a step's saved activations are freed as the backward
// pass goes (as PyTorch's autograd frees a node's saved tensors, and as
// the CUDA backend drops its own), not held until the op's next forward.
void op_release_saved(Op& op);

}  // namespace spindle::exec
