// MPI_CHECK(call): runs an MPI call; on any result other than MPI_SUCCESS
// logs the world rank, file, line, the call and MPI's error string to
// stderr and aborts the whole job with MPI_Abort (docs/architecture.md, convention 10: one
// failed rank cannot be recovered). Communicators must use
// MPI_ERRORS_RETURN for the check to see errors (mpi_comm.cpp sets it).
#pragma once

#include <mpi.h>

namespace spindle::exec {

[[noreturn]] void mpi_fail(int code, const char* call, const char* file, int line);

}  // namespace spindle::exec

#define MPI_CHECK(call)                                                      \
  do {                                                                       \
    const int spindle_mpi_rc_ = (call);                                      \
    if (spindle_mpi_rc_ != MPI_SUCCESS)                                      \
      ::spindle::exec::mpi_fail(spindle_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
