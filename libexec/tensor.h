// Tensors of the runtime: fp32, row-major, contiguous.
//
// A Tensor is a shape plus a shared handle to storage that lives on one
// device (host memory for the CPU backend; a later CUDA backend allocates
// device memory through Backend::allocate and wraps it with Tensor::wrap).
// Copying a Tensor copies the handle, not the data (use clone() for a deep
// copy). Contract used throughout libexec: a tensor produced by an op is not
// written again by anyone but its producer, so sharing it (e.g. saving an
// input for backward) is safe.
//
// Integer data (token ids, targets) travels as fp32 holding exact integers
// (exact below 2^24, far above every vocabulary).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <Eigen/Core>

namespace spindle::exec {

using Shape = std::vector<int64_t>;

enum class Device { host, cuda };

// Row-major float matrices and maps onto tensor memory (host only).
using MatrixRM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<MatrixRM>;
using ConstMatMap = Eigen::Map<const MatrixRM>;
using VecMap = Eigen::Map<Eigen::VectorXf>;
using ConstVecMap = Eigen::Map<const Eigen::VectorXf>;
using RowMap = Eigen::Map<Eigen::RowVectorXf>;
using ConstRowMap = Eigen::Map<const Eigen::RowVectorXf>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);   // "[2, 3, 4]"

class Tensor {
 public:
  Tensor() = default;

  // Host tensor of `shape`, every element 0.
  static Tensor zeros(Shape shape);
  // Host tensor holding `values` (size must equal the shape's element count).
  static Tensor from(Shape shape, std::vector<float> values);
  // Wraps memory owned by `storage` (any device); for backends.
  static Tensor wrap(Shape shape, Device device, std::shared_ptr<float[]> storage);

  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const { return shape_.at(static_cast<size_t>(d)); }
  int64_t numel() const { return numel_; }
  Device device() const { return device_; }
  bool empty() const { return storage_ == nullptr; }

  // Pointer to the first element in the tensor's device memory.
  float* data() { return storage_.get(); }
  const float* data() const { return storage_.get(); }

  // Element i (flat index) of a host tensor.
  float& operator[](int64_t i) { return storage_[i]; }
  float operator[](int64_t i) const { return storage_[i]; }

  // The host tensor viewed as a rows x cols row-major matrix
  // (rows * cols == numel()).
  MatMap mat(int64_t rows, int64_t cols);
  ConstMatMap mat(int64_t rows, int64_t cols) const;
  VecMap vec();
  ConstVecMap vec() const;
  // All elements as one row vector (for row-wise broadcasting).
  RowMap row_vec();
  ConstRowMap row_vec() const;

  // Same storage, another shape with the same element count.
  Tensor reshaped(Shape shape) const;
  // Deep copy (host only).
  Tensor clone() const;
  // Sets every element to 0 (host only).
  void zero();

 private:
  Shape shape_;
  int64_t numel_ = 0;
  Device device_ = Device::host;
  std::shared_ptr<float[]> storage_;
};

// Rows [row0, row0 + rows) of a host tensor along dimension 0, copied.
Tensor slice_rows(const Tensor& t, int64_t row0, int64_t rows);
// Concatenation along dimension 0 (all other dimensions equal), copied.
Tensor concat_rows(const std::vector<Tensor>& parts);

// The bytes of host tensor storage this process holds: every Tensor::zeros
// (and what is built on it: from, clone, the CPU backend's allocate, the
// operators' saved state, the executor's buffers), counted from allocation
// to the release of its last handle; not storage wrapped from elsewhere
// (Tensor::wrap: device memory) nor memory that is not a tensor's
// (communicators' own buffers, containers). Thread-safe.
int64_t host_tensor_bytes();
// The most held at once since the last reset_host_tensor_peak() (which sets
// it to what is held then), or since the start.
int64_t host_tensor_peak_bytes();
void reset_host_tensor_peak();

}  // namespace spindle::exec
