// Rank discovery from launcher variables (docs/building.md, "Conventions users already parse").
//
// MPI's rank and size are the truth; the launcher's variables are
// cross-checked against them and give the local rank (the device index on a
// node: the CUDA backend binds GPU `local_rank`). Launchers, in precedence:
//   openmpi  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_SIZE
//   slurm    SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS
//   generic  RANK, LOCAL_RANK, WORLD_SIZE (torchrun style)
// The launcher is the first group with its rank variable set. Under mpirun
// inside a Slurm job the SLURM_* variables describe the Slurm step (mpirun's
// own task), not the MPI job, so they are ignored when the openmpi group is
// present. The generic variables, when set, must agree as well (a stale
// RANK in the environment is an error worth seeing).
//
// Pure functions of an environment map, so they are tested without a
// launcher; process_launch_env() reads the real environment.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace spindle::exec {

using EnvMap = std::map<std::string, std::string>;

struct LaunchEnv {
  std::string launcher = "none";  // openmpi | slurm | generic | none
  int rank = -1;                  // from the launcher's rank variable; -1: none
  int size = -1;                  // from its size variable; -1: none
  int local_rank = -1;            // from its local-rank variable; -1: none
  std::string local_rank_var;     // the variable local_rank came from ("" if none)
};

// Every variable read by discover_launch_env, in precedence order.
const std::vector<std::string>& launch_env_vars();

// The process environment restricted to launch_env_vars().
EnvMap process_launch_env();

// Reads the launcher's rank, size and local rank from `env` and checks them
// against MPI's `mpi_rank` and `mpi_size`. Returns "" and fills `out` on
// success; otherwise one message naming the variable, its value and what
// MPI says, e.g. "SLURM_PROCID=2 but the MPI rank is 1 (...)".
// Rules: a value must be a non-negative decimal integer; each group's rank
// and size variables that are set must equal MPI's; local ranks must lie in
// [0, size) and agree between the groups that are checked. Without a local
// rank variable, local_rank is the MPI rank (right on one node) and
// local_rank_var is ""; the programs, which have MPI, then take
// node_local_rank() (mpi_comm.h) instead, right on any number of nodes.
std::string discover_launch_env(const EnvMap& env, int mpi_rank, int mpi_size, LaunchEnv* out);

// Before MPI starts: the rank a launcher that starts several processes
// gave this one (OMPI_COMM_WORLD_RANK, else SLURM_PROCID), -1 when neither
// is set or the value is malformed. The generic RANK is not read: a stale
// one from a torchrun shell would silence a process started by hand.
// spindle-run reads its command line before MPI_Init and lets the process
// whose launcher rank is 0 or -1 report a bad one for all.
int launcher_rank(const EnvMap& env);
// The number of processes that launcher started (OMPI_COMM_WORLD_SIZE, or
// SLURM_NTASKS, of the group launcher_rank reads); -1 when unknown.
int launcher_size(const EnvMap& env);

}  // namespace spindle::exec
