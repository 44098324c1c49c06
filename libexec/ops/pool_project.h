// pool_project: [b, s, in] -> [b, 1, out]: mean over s, LayerNorm, linear.
// Parameters: ln_g, ln_b [in]; w [in, out]; bias [out] (in*out + out + 2*in).
// Not split under TP.
#pragma once

#include "libexec/ops/kernels.h"
#include "libexec/ops/op_config.h"
#include "libexec/ops/param.h"

namespace spindle::exec {

struct PoolProjectState {
  OpConfig cfg;
  ParamSet* params = nullptr;  // not owned
  int64_t seq = 0;             // s of the last forward
  LayerNormCache ln;
  Tensor z;                    // LayerNorm output [b, 1, in]
};

// The initialisation of its parameter tensor `tensor` (a name of
// plan::op_param_tensors for this op; make_params allocates them).
InitSpec pool_project_param_init(const OpConfig& cfg, const std::string& tensor);
void pool_project_init(PoolProjectState& s, const OpConfig& cfg, ParamSet& params);
Tensor pool_project_forward(PoolProjectState& s, const Tensor& x);
Tensor pool_project_backward(PoolProjectState& s, const Tensor& dy);  // returns dL/dx [b, s, in]

}  // namespace spindle::exec
