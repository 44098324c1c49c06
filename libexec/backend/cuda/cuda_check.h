// CUDA_CHECK / CUBLAS_CHECK / NCCL_CHECK (docs/architecture.md, convention 10): run a CUDA
// runtime, cuBLAS or NCCL call; on failure log the world rank (when MPI is
// up), file, line, the call and the library's error string to stderr and
// abort the whole job (MPI_Abort when MPI is initialised, else std::abort):
// one failed rank cannot be recovered. Host code only (no kernels here).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace spindle::exec {

// Bytes of one fp32 value in device buffers (sizes of copies and allocations).
inline constexpr size_t kFloatBytes = sizeof(float);

[[noreturn]] void cuda_fail(const char* library, const char* what, const char* call, const char* file,
                            int line);

}  // namespace spindle::exec

#define CUDA_CHECK(call)                                                                         \
  do {                                                                                           \
    const cudaError_t spindle_cuda_rc_ = (call);                                                 \
    if (spindle_cuda_rc_ != cudaSuccess)                                                         \
      ::spindle::exec::cuda_fail("CUDA", cudaGetErrorString(spindle_cuda_rc_), #call, __FILE__, \
                                 __LINE__);                                                      \
  } while (0)

#define CUBLAS_CHECK(call)                                                                            \
  do {                                                                                                \
    const cublasStatus_t spindle_cublas_rc_ = (call);                                                 \
    if (spindle_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                                  \
      ::spindle::exec::cuda_fail("cuBLAS", cublasGetStatusString(spindle_cublas_rc_), #call, __FILE__, \
                                 __LINE__);                                                           \
  } while (0)

// Checks the last kernel launch (configuration errors show up here; faults
// inside the kernel show up at the next synchronising call).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
