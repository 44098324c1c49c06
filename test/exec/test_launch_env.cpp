// Rank discovery (libexec/comm/launch_env.h) with fake environments.
#include <catch2/catch.hpp>

#include "libexec/comm/launch_env.h"

using namespace spindle::exec;

namespace {
// Runs discovery; returns the error ("" on success) and fills `out`.
std::string discover(const EnvMap& env, int rank, int size, LaunchEnv* out) {
  return discover_launch_env(env, rank, size, out);
}
}  // namespace

TEST_CASE("launch env: Open MPI variables give rank, size and local rank") {
  LaunchEnv e;
  REQUIRE(discover({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}},
                   5, 8, &e) == "");
  CHECK(e.launcher == "openmpi");
  CHECK(e.rank == 5);
  CHECK(e.size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_rank_var == "OMPI_COMM_WORLD_LOCAL_RANK");
}

TEST_CASE("launch env: srun direct launch uses the SLURM variables") {
  LaunchEnv e;
  REQUIRE(discover({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"}}, 6, 8, &e) == "");
  CHECK(e.launcher == "slurm");
  CHECK(e.local_rank == 2);
  CHECK(e.local_rank_var == "SLURM_LOCALID");
}

TEST_CASE("launch env: mismatches name the variable and MPI's value") {
  LaunchEnv e;
  std::string err = discover({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}}, 1, 4, &e);
  CHECK(err.find("SLURM_PROCID=2 but the MPI rank is 1") != std::string::npos);
  err = discover({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "3"}}, 1, 4, &e);
  CHECK(err.find("OMPI_COMM_WORLD_SIZE=3 but the MPI world has 4 ranks") != std::string::npos);
  err = discover({{"RANK", "0"}, {"WORLD_SIZE", "4"}}, 3, 4, &e);
  CHECK(err.find("RANK=0") != std::string::npos);
  err = discover({{"OMPI_COMM_WORLD_RANK", "x1"}}, 1, 4, &e);
  CHECK(err.find("OMPI_COMM_WORLD_RANK='x1' is not a non-negative integer") != std::string::npos);
  err = discover({{"LOCAL_RANK", "9"}}, 1, 4, &e);
  CHECK(err.find("LOCAL_RANK=9 is not below the world size 4") != std::string::npos);
  // Open MPI and the generic variables both checked: local ranks must agree.
  err = discover({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"LOCAL_RANK", "0"}}, 1, 4,
                 &e);
  CHECK(err.find("LOCAL_RANK=0 disagrees with OMPI_COMM_WORLD_LOCAL_RANK=1") != std::string::npos);
}

TEST_CASE("launch env: under mpirun inside a Slurm job the SLURM variables are not the MPI job's") {
  // The batch step's task 0 ran mpirun; its children inherit SLURM_PROCID=0.
  LaunchEnv e;
  REQUIRE(discover({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"},
                    {"SLURM_LOCALID", "0"}},
                   3, 8, &e) == "");
  CHECK(e.launcher == "openmpi");
  CHECK(e.local_rank == 3);
}

TEST_CASE("launch env: no launcher variables: local rank is the MPI rank") {
  LaunchEnv e;
  REQUIRE(discover({}, 2, 4, &e) == "");
  CHECK(e.launcher == "none");
  CHECK(e.local_rank == 2);
  CHECK(e.local_rank_var.empty());
  // Every variable discovery reads is listed for process_launch_env.
  CHECK(launch_env_vars().size() == 9);
}

TEST_CASE("launch env: the launcher's rank before MPI starts") {
  CHECK(launcher_rank({}) == -1);
  CHECK(launcher_rank({{"OMPI_COMM_WORLD_RANK", "3"}}) == 3);
  CHECK(launcher_rank({{"OMPI_COMM_WORLD_RANK", "0"}, {"SLURM_PROCID", "4"}}) == 0);   // mpirun inside a Slurm job
  CHECK(launcher_rank({{"SLURM_PROCID", "2"}}) == 2);
  CHECK(launcher_rank({{"RANK", "5"}}) == -1);   // a stale torchrun RANK does not count
  CHECK(launcher_rank({{"OMPI_COMM_WORLD_RANK", "x1"}}) == -1);
}

TEST_CASE("launch env: the launcher's size before MPI starts, of the group that gave the rank") {
  CHECK(launcher_size({}) == -1);
  CHECK(launcher_size({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}}) == 1);
  // mpirun inside a Slurm job of 8 tasks: mpirun's 2 processes.
  CHECK(launcher_size({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"},
                       {"SLURM_NTASKS", "8"}}) == 2);
  CHECK(launcher_size({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}}) == 4);
  CHECK(launcher_size({{"OMPI_COMM_WORLD_SIZE", "4"}}) == -1);   // no rank: not a launched process
  CHECK(launcher_size({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}}) == -1);
  CHECK(launcher_size({{"OMPI_COMM_WORLD_RANK", "0"}}) == -1);
}
