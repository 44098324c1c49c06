// patch_embed: synthetic features [b, s, in_dim] -> [b, s, hidden],
// y[b, t] = x[b, t] W + bias + pos[t], t < s <= max_seq.
// Parameters: w [in_dim, hidden], bias [hidden], pos [max_seq, hidden]
// (in_dim*hidden + hidden + S*hidden). Not split under TP. The input is
// data: backward returns no input gradient.
#pragma once

#include "libexec/ops/op_config.h"
#include "libexec/ops/param.h"

namespace spindle::exec {

struct PatchEmbedState {
  OpConfig cfg;
  ParamSet* params = nullptr;  // not owned: w, bias, pos
  Tensor x;                    // saved input
};

// The initialisation of its parameter tensor `tensor` (a name of
// plan::op_param_tensors for this op; make_params allocates them).
InitSpec patch_embed_param_init(const OpConfig& cfg, const std::string& tensor);
void patch_embed_init(PatchEmbedState& s, const OpConfig& cfg, ParamSet& params);
Tensor patch_embed_forward(PatchEmbedState& s, const Tensor& x);
void patch_embed_backward(PatchEmbedState& s, const Tensor& dy);  // parameter gradients only

}  // namespace spindle::exec
