#include "libexec/ops/pool_project.h"

#include <cmath>

namespace spindle::exec {

InitSpec pool_project_param_init(const OpConfig& cfg, const std::string& tensor) {
  if (tensor == "ln_g") return {InitKind::ones, 0};
  if (tensor == "w") return {InitKind::uniform, 1.0f / std::sqrt(static_cast<float>(cfg.dim("in")))};
  return {InitKind::zeros, 0};   // ln_b, bias
}

void pool_project_init(PoolProjectState& s, const OpConfig& cfg, ParamSet& params) {
  s.cfg = cfg;
  s.params = &params;
}

Tensor pool_project_forward(PoolProjectState& s, const Tensor& x) {
  std::vector<Param>& p = s.params->params;
  const int64_t b = x.size(0), seq = x.size(1), in = x.size(2);
  s.seq = seq;
  Tensor m = Tensor::zeros({b, 1, in});
  for (int64_t i = 0; i < b; ++i)
    m.mat(b, in).row(i) = x.mat(b * seq, in).middleRows(i * seq, seq).colwise().mean();
  s.z = layernorm_forward(m, p[0].value, p[1].value, s.ln);
  return linear_rows(s.z, p[2].value, &p[3].value);
}

Tensor pool_project_backward(PoolProjectState& s, const Tensor& dy) {
  std::vector<Param>& p = s.params->params;
  const int64_t b = s.z.size(0), in = s.z.size(2), seq = s.seq;
  Tensor dz = linear_rows_backward(s.z, p[2].value, dy, p[2].grad, &p[3].grad, true);
  Tensor dm = layernorm_backward(dz, p[0].value, s.ln, p[0].grad, p[1].grad);
  Tensor dx = Tensor::zeros({b, seq, in});
  for (int64_t i = 0; i < b; ++i)
    dx.mat(b * seq, in).middleRows(i * seq, seq).rowwise() =
        dm.mat(b, in).row(i) / static_cast<float>(seq);
  return dx;
}

}  // namespace spindle::exec
