// token_embed: synthetic token ids [b, s] (fp32 holding integers in
// 0..vocab-1) -> [b, s, hidden], y[b, t] = table[id[b, t]] + pos[t].
// Parameters: table [vocab, hidden], pos [max_seq, hidden]
// (vocab*hidden + S*hidden). Not split under TP. Backward returns no input
// gradient.
#pragma once

#include "libexec/ops/op_config.h"
#include "libexec/ops/param.h"

namespace spindle::exec {

struct TokenEmbedState {
  OpConfig cfg;
  ParamSet* params = nullptr;  // not owned: table, pos
  Tensor ids;                  // saved input
};

// The initialisation of its parameter tensor `tensor` (a name of
// plan::op_param_tensors for this op; make_params allocates them).
InitSpec token_embed_param_init(const OpConfig& cfg, const std::string& tensor);
void token_embed_init(TokenEmbedState& s, const OpConfig& cfg, ParamSet& params);
// Throws std::out_of_range for an id outside the vocabulary.
Tensor token_embed_forward(TokenEmbedState& s, const Tensor& ids);
void token_embed_backward(TokenEmbedState& s, const Tensor& dy);  // parameter gradients only

}  // namespace spindle::exec
