#include "libexec/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <stdexcept>

namespace spindle::exec {

namespace {

class CpuBackend final : public Backend {
 public:
  // `says`: the memory device() reports; the tensors are host memory either way.
  explicit CpuBackend(Device says) : says_(says) {}

  const char* name() const override { return "cpu"; }
  Device device() const override { return says_; }

  Tensor allocate(Shape shape) override { return Tensor::zeros(std::move(shape)); }
  void zero(Tensor& t) override { t.zero(); }

  void copy(const Tensor& src, Tensor& dst) override {
    if (src.device() != Device::host || dst.device() != Device::host)
      throw std::invalid_argument("cpu backend: copy of non-host memory");
    if (src.numel() != dst.numel())
      throw std::invalid_argument("cpu backend: copy " + shape_str(src.shape()) + " into " +
                                  shape_str(dst.shape()));
    std::copy(src.data(), src.data() + src.numel(), dst.data());
  }

  void synchronize() override {}

  void add(const Tensor& src, Tensor& dst) override {
    if (src.device() != Device::host || dst.device() != Device::host)
      throw std::invalid_argument("cpu backend: add of non-host memory");
    if (src.numel() != dst.numel())
      throw std::invalid_argument("cpu backend: add " + shape_str(src.shape()) + " into " + shape_str(dst.shape()));
    for (int64_t i = 0; i < src.numel(); ++i) dst[i] += src[i];
  }

  Tensor forward(Op& op, std::span<const Tensor> inputs) override {
    return op_forward(op, inputs);
  }

  std::vector<Tensor> backward(Op& op, const Tensor& grad_output) override {
    std::vector<Tensor> dx = op_backward(op, grad_output);
    op_release_saved(op);
    return dx;
  }

  void release_saved(Op& op) override { op_release_saved(op); }

  void adamw_step(const AdamWConfig& cfg, int64_t step, Tensor& param, const Tensor& grad,
                  Tensor& m, Tensor& v) override {
    exec::adamw_step(cfg, step, param, grad, m, v);
  }

  int64_t peak_bytes() override { return host_tensor_peak_bytes(); }
  void reset_peak_bytes() override { reset_host_tensor_peak(); }

 private:
  Device says_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(Device::host); }

std::unique_ptr<Backend> make_cpu_backend_as_device() { return std::make_unique<CpuBackend>(Device::cuda); }

}  // namespace spindle::exec
