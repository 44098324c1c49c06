// Helper of gpu_equiv.sh and scripts/gpu-check.sh (label gpu).
//
//   gpu_tool count    prints the number of CUDA devices (0 without a driver)
//
// The runs themselves are compared by compare_runs (test/exec/mpi).
#include <cstdio>
#include <string>

#include "libexec/backend/cuda/cuda_backend.h"

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) != "count") {
    std::fprintf(stderr, "usage: gpu_tool count\n");
    return 2;
  }
  std::printf("%d\n", spindle::exec::cuda_device_count());
  return 0;
}
