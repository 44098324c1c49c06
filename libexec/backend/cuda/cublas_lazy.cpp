// cuBLAS opened on first use (dlopen), not when a program starts.
//
// Linked the usual way, libcublas (and libcublasLt, which it needs: 600 MB
// together) is mapped by every process that links spindle_exec, and its
// 392,000 relocations are applied at start: 0.33 s of CPU and 26,000 page
// faults here, so that `spindle-run --help` took 0.8 s and every CPU rank
// of every run and test paid it (docs/building.md). The CUDA backend calls
// six cuBLAS functions. This file defines them, each forwarding to the
// real one in the library, opened on the first call (once, thread-safe):
// a process that never creates a CUDA backend never opens it. The
// definitions are checked against the declarations of <cublas_v2.h> (a
// different signature does not compile), and the executables do not export
// them (nothing links them dynamically), so the library's own calls stay
// inside it.
#include <dlfcn.h>

#include <cublas_v2.h>

#include <string>

#include "libexec/backend/cuda/cuda_check.h"

#ifndef SPINDLE_CUBLAS_SONAME
#error "SPINDLE_CUBLAS_SONAME (e.g. \"libcublas.so.13\") and SPINDLE_CUBLAS_PATH come from backend/cuda/targets.cmake"
#endif

namespace spindle::exec {
namespace {

// The C entry points (C++ also sees overloads of the two gemms that take
// the older cudaDataType compute type: those are inline in the header).
using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                  const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                  cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
using GemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                                const void*, const void*, cudaDataType, int, long long int,
                                                const void*, cudaDataType, int, long long int, const void*, void*,
                                                cudaDataType, int, long long int, int, cublasComputeType_t,
                                                cublasGemmAlgo_t);

// The cuBLAS functions the backend calls, resolved in the library.
struct CublasCalls {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  GemmEx gemm = nullptr;
  GemmStridedBatchedEx gemm_batched = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// `name` in `lib`, or the job aborts naming it (cuda_fail).
template <typename F>
F cublas_symbol(void* lib, const char* name) {
  void* f = dlsym(lib, name);
  if (f == nullptr) cuda_fail("cuBLAS", dlerror(), name, __FILE__, __LINE__);
  return reinterpret_cast<F>(f);
}

// The library by its SONAME (the loader's search: the executable's
// RUNPATH, LD_LIBRARY_PATH, the cache), else where the build found it; the
// job aborts when neither opens.
CublasCalls open_cublas() {
  void* lib = dlopen(SPINDLE_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const std::string by_name = dlerror();
    lib = dlopen(SPINDLE_CUBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const std::string why = by_name + "; " + dlerror();
      cuda_fail("cuBLAS", why.c_str(), "dlopen(" SPINDLE_CUBLAS_SONAME ")", __FILE__, __LINE__);
    }
  }
  CublasCalls c;
  c.create = cublas_symbol<decltype(c.create)>(lib, "cublasCreate_v2");
  c.destroy = cublas_symbol<decltype(c.destroy)>(lib, "cublasDestroy_v2");
  c.set_stream = cublas_symbol<decltype(c.set_stream)>(lib, "cublasSetStream_v2");
  c.gemm = cublas_symbol<decltype(c.gemm)>(lib, "cublasGemmEx");
  c.gemm_batched = cublas_symbol<decltype(c.gemm_batched)>(lib, "cublasGemmStridedBatchedEx");
  c.status_string = cublas_symbol<decltype(c.status_string)>(lib, "cublasGetStatusString");
  return c;   // the library stays open until the process ends
}

const CublasCalls& cublas() {
  static const CublasCalls calls = open_cublas();
  return calls;
}

}  // namespace
}  // namespace spindle::exec

// The six entry points, with the header's C linkage.
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) { return spindle::exec::cublas().create(handle); }

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) { return spindle::exec::cublas().destroy(handle); }

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  return spindle::exec::cublas().set_stream(handle, streamId);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return spindle::exec::cublas().gemm(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C,
                                      Ctype, ldc, computeType, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return spindle::exec::cublas().gemm_batched(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B,
                                              Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
                                              computeType, algo);
}

const char* cublasGetStatusString(cublasStatus_t status) { return spindle::exec::cublas().status_string(status); }
