// The CUDA backend (docs/gpu.md): cuBLAS for every matrix product, the fused
// kernels of cuda_kernels.h for LayerNorm, GELU, softmax/attention (plain,
// not flash: the [b, heads, sp, sp] probabilities, sp = seq rounded up
// to a multiple of 8, are kept for backward), the
// losses and AdamW. Storage is fp32 on the device (activations, parameters,
// gradients, AdamW moments); with MatmulPrecision::bf16 the matrix products
// run on the tensor cores in bf16 with fp32 accumulation
// (CUBLAS_COMPUTE_32F_FAST_16BF), with fp32 they are exact fp32 GEMMs.
//
// Memory: tensors from allocate() and op outputs are device tensors
// (Device::cuda) from the stream-ordered pool (cudaMallocAsync); freeing is
// asynchronous and ordered with the work. Everything runs on the legacy
// default stream of the device current when the backend was made.
//
// Host tensors are accepted everywhere (tests and tools pass them): an op
// whose inputs are host tensors gets its output on the host (forward) and
// its input gradients on the host (backward, when dy is a host tensor); loss
// values are always host [1] tensors. Parameters held on the host are
// uploaded on every forward, their gradients uploaded, accumulated and
// downloaded on every backward, and adamw_step on host tensors stages all
// four through the device: correct, and slow. The executor keeps
// parameters, gradients, AdamW moments and activations in this backend's
// memory (docs/gpu.md, "What the executor does on a device").
// Parameters whose value and grad are device tensors are used in place.
//
// Errors: CUDA/cuBLAS/NCCL failures abort the job (cuda_check.h); bad
// arguments throw like the CPU operators (std::invalid_argument, and
// std::out_of_range for a token id or target outside the vocabulary).
#pragma once

#include <memory>
#include <string>

#include "libexec/backend/backend.h"

namespace spindle::exec {

enum class MatmulPrecision { bf16, fp32 };

struct CudaOptions {
  MatmulPrecision matmul = MatmulPrecision::bf16;
};

// Number of CUDA devices this process sees; 0 when there is no driver, no
// device, or any error (never aborts).
int cuda_device_count();

// cudaSetDevice(local_rank % cuda_device_count()); returns the device index.
// Call before making the backend and before any NCCL communicator. Aborts
// when there is no device.
int cuda_bind_device(int local_rank);

// The current device, for reports (name e.g. "NVIDIA H200").
struct CudaDeviceInfo {
  std::string name;
  std::string pci_bus_id;  // e.g. "0000:3B:00.0": which physical GPU, whatever CUDA_VISIBLE_DEVICES says
  int sm_count = 0;
  double memory_gbytes = 0;
};
CudaDeviceInfo cuda_device_info();

// A backend on the current device. Requires cuda_device_count() > 0.
std::unique_ptr<Backend> make_cuda_backend(CudaOptions options = {});

// The precision make_backend("cuda") uses: SPINDLE_CUDA_MATMUL=fp32|bf16
// (default bf16); anything else is an error message in *error.
CudaOptions cuda_options_from_env(std::string* error);

}  // namespace spindle::exec
