#include "libexec/tensor.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <sstream>
#include <stdexcept>

namespace spindle::exec {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(shape));
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

namespace {

std::atomic<int64_t> g_host_bytes{0}, g_host_peak{0};

void raise_host_peak(int64_t held) {
  int64_t peak = g_host_peak.load(std::memory_order_relaxed);
  while (held > peak && !g_host_peak.compare_exchange_weak(peak, held, std::memory_order_relaxed)) {
  }
}

}  // namespace

int64_t host_tensor_bytes() { return g_host_bytes.load(std::memory_order_relaxed); }
int64_t host_tensor_peak_bytes() { return g_host_peak.load(std::memory_order_relaxed); }
void reset_host_tensor_peak() { g_host_peak.store(host_tensor_bytes(), std::memory_order_relaxed); }

Tensor Tensor::zeros(Shape shape) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  const size_t n = static_cast<size_t>(std::max<int64_t>(t.numel_, 1));
  const auto bytes = static_cast<int64_t>(n * sizeof(float));
  float* values = new float[n]();
  // Counted before the handle exists: if making it throws, it calls the
  // deleter, which takes the bytes off again.
  raise_host_peak(g_host_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  t.storage_ = std::shared_ptr<float[]>(values, [bytes](float* p) {
    delete[] p;
    g_host_bytes.fetch_sub(bytes, std::memory_order_relaxed);
  });
  return t;
}

Tensor Tensor::from(Shape shape, std::vector<float> values) {
  Tensor t = zeros(std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel_)
    throw std::invalid_argument("Tensor::from: " + std::to_string(values.size()) +
                                " values for shape " + shape_str(t.shape_));
  std::copy(values.begin(), values.end(), t.storage_.get());
  return t;
}

Tensor Tensor::wrap(Shape shape, Device device, std::shared_ptr<float[]> storage) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.device_ = device;
  t.storage_ = std::move(storage);
  return t;
}

MatMap Tensor::mat(int64_t rows, int64_t cols) {
  assert(device_ == Device::host && rows * cols == numel_);
  return MatMap(data(), rows, cols);
}

ConstMatMap Tensor::mat(int64_t rows, int64_t cols) const {
  assert(device_ == Device::host && rows * cols == numel_);
  return ConstMatMap(data(), rows, cols);
}

VecMap Tensor::vec() {
  assert(device_ == Device::host);
  return VecMap(data(), numel_);
}

ConstVecMap Tensor::vec() const {
  assert(device_ == Device::host);
  return ConstVecMap(data(), numel_);
}

RowMap Tensor::row_vec() {
  assert(device_ == Device::host);
  return RowMap(data(), numel_);
}

ConstRowMap Tensor::row_vec() const {
  assert(device_ == Device::host);
  return ConstRowMap(data(), numel_);
}

Tensor Tensor::reshaped(Shape shape) const {
  if (shape_numel(shape) != numel_)
    throw std::invalid_argument("reshape " + shape_str(shape_) + " to " + shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  assert(device_ == Device::host);
  Tensor t = zeros(shape_);
  std::copy(data(), data() + numel_, t.data());
  return t;
}

void Tensor::zero() {
  assert(device_ == Device::host);
  std::fill(data(), data() + numel_, 0.0f);
}

Tensor slice_rows(const Tensor& t, int64_t row0, int64_t rows) {
  if (t.rank() == 0 || row0 < 0 || rows < 0 || row0 + rows > t.size(0))
    throw std::out_of_range("slice_rows out of range for " + shape_str(t.shape()));
  Shape shape = t.shape();
  shape[0] = rows;
  Tensor out = Tensor::zeros(shape);
  const int64_t row_elems = t.size(0) ? t.numel() / t.size(0) : 0;
  std::copy(t.data() + row0 * row_elems, t.data() + (row0 + rows) * row_elems, out.data());
  return out;
}

Tensor concat_rows(const std::vector<Tensor>& parts) {
  if (parts.empty()) throw std::invalid_argument("concat_rows of nothing");
  Shape shape = parts[0].shape();
  int64_t rows = 0;
  for (const Tensor& p : parts) {
    Shape a = p.shape(), b = shape;
    a[0] = b[0] = 0;
    if (a != b) throw std::invalid_argument("concat_rows: shapes differ beyond dimension 0");
    rows += p.size(0);
  }
  shape[0] = rows;
  Tensor out = Tensor::zeros(shape);
  float* dst = out.data();
  for (const Tensor& p : parts) dst = std::copy(p.data(), p.data() + p.numel(), dst);
  return out;
}

}  // namespace spindle::exec
