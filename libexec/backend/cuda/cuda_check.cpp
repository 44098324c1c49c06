#include "libexec/backend/cuda/cuda_check.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

namespace spindle::exec {

void cuda_fail(const char* library, const char* what, const char* call, const char* file, int line) {
  int mpi_up = 0, finalized = 0, rank = -1;
  MPI_Initialized(&mpi_up);
  MPI_Finalized(&finalized);
  if (mpi_up && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "spindle: rank %d: %s error at %s:%d: %s: %s\n", rank, library, file, line, call, what);
  std::fflush(stderr);
  if (mpi_up && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace spindle::exec
