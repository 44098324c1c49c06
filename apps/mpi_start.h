// For the mains that start MPI (spindle-run, spindle-profile --measure):
// ending a run refused before MPI starts, said once for all ranks.
#pragma once

#include <functional>

#include <mpi.h>

#include "libexec/comm/launch_env.h"
#include "libexec/comm/mpi_check.h"
#include "libexec/comm/mpi_comm.h"

namespace spindle::apps {

// Ends a run refused before MPI starts (a bad command line) with
// `exit_code`. Every rank reads the same line, so only the launcher's rank
// 0, or a process started alone, says why (`say`). With other ranks, a
// refused line ends every rank only once rank 0 has said it: the first rank
// to end makes mpirun end the job, which cut rank 0 off (seen under the
// sanitizers, where ranks start up to a second apart). A barrier rank 0
// enters after printing orders the ends.
inline int end_before_mpi(int* argc, char*** argv, int exit_code, const std::function<void()>& say) {
  const exec::EnvMap env = exec::process_launch_env();
  const int launched_as = exec::launcher_rank(env);   // -1: started alone
  if (launched_as <= 0) say();
  if (launched_as >= 0 && exec::launcher_size(env) != 1 && exit_code != 0) {
    exec::MpiSession session(argc, argv);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  }
  return exit_code;
}

}  // namespace spindle::apps
