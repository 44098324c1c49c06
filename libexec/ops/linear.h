// linear: [b, s, in] -> [b, s, out], y = x W + bias per token.
// Parameters: w [in, out], bias [out] (in*out + out). Not split under TP.
#pragma once

#include "libexec/ops/op_config.h"
#include "libexec/ops/param.h"

namespace spindle::exec {

struct LinearState {
  OpConfig cfg;
  ParamSet* params = nullptr;  // not owned: w, bias
  Tensor x;                    // saved input
};

// The initialisation of its parameter tensor `tensor` (a name of
// plan::op_param_tensors for this op; make_params allocates them).
InitSpec linear_param_init(const OpConfig& cfg, const std::string& tensor);
void linear_init(LinearState& s, const OpConfig& cfg, ParamSet& params);
Tensor linear_forward(LinearState& s, const Tensor& x);
// Adds parameter gradients; returns dL/dx.
Tensor linear_backward(LinearState& s, const Tensor& dy);

}  // namespace spindle::exec
