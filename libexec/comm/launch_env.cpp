#include "libexec/comm/launch_env.h"

#include <cstdlib>

namespace spindle::exec {

namespace {

struct LauncherVars {
  const char* launcher;
  const char* rank_var;
  const char* local_var;
  const char* size_var;
};

constexpr LauncherVars kGroups[] = {
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"},
    {"generic", "RANK", "LOCAL_RANK", "WORLD_SIZE"},
};

// The value of `var` as a non-negative int: -1 when unset, -2 when malformed.
int read_int(const EnvMap& env, const char* var) {
  const auto it = env.find(var);
  if (it == env.end()) return -1;
  const std::string& s = it->second;
  if (s.empty() || s.size() > 9) return -2;
  for (char c : s)
    if (c < '0' || c > '9') return -2;
  return std::atoi(s.c_str());
}

std::string value_of(const EnvMap& env, const char* var) { return env.at(var); }

}  // namespace

const std::vector<std::string>& launch_env_vars() {
  static const std::vector<std::string> vars = [] {
    std::vector<std::string> v;
    for (const LauncherVars& g : kGroups)
      for (const char* name : {g.rank_var, g.local_var, g.size_var}) v.emplace_back(name);
    return v;
  }();
  return vars;
}

EnvMap process_launch_env() {
  EnvMap env;
  for (const std::string& var : launch_env_vars())
    if (const char* v = std::getenv(var.c_str())) env[var] = v;
  return env;
}

namespace {
// Before MPI starts: the group of the launcher that started this process,
// openmpi before slurm (mpirun inside a Slurm job), the first whose rank
// variable is set (even malformed); null when neither is.
const LauncherVars* launching_group(const EnvMap& env) {
  for (const LauncherVars* g : {&kGroups[0], &kGroups[1]})
    if (read_int(env, g->rank_var) != -1) return g;
  return nullptr;
}
}  // namespace

int launcher_rank(const EnvMap& env) {
  const LauncherVars* g = launching_group(env);
  const int rank = g ? read_int(env, g->rank_var) : -1;
  return rank >= 0 ? rank : -1;
}

int launcher_size(const EnvMap& env) {
  const LauncherVars* g = launching_group(env);
  const int size = g ? read_int(env, g->size_var) : -1;
  return size >= 1 ? size : -1;
}

std::string discover_launch_env(const EnvMap& env, int mpi_rank, int mpi_size, LaunchEnv* out) {
  LaunchEnv found;
  const bool openmpi = env.count(kGroups[0].rank_var) > 0;
  for (const LauncherVars& g : kGroups) {
    const std::string launcher = g.launcher;
    // Which groups speak for this job (header): slurm's variables describe
    // mpirun's Slurm task when Open MPI launched us; the generic group is
    // checked whenever any of its variables is set.
    bool checked = env.count(g.rank_var) > 0;
    if (launcher == "slurm" && openmpi) checked = false;
    if (launcher == "generic") checked = env.count(g.rank_var) || env.count(g.local_var) || env.count(g.size_var);
    if (!checked) continue;
    const int rank = read_int(env, g.rank_var), size = read_int(env, g.size_var),
              local = read_int(env, g.local_var);
    for (const auto& [var, v] : {std::pair{g.rank_var, rank}, {g.size_var, size}, {g.local_var, local}})
      if (v == -2)
        return std::string(var) + "='" + value_of(env, var) + "' is not a non-negative integer";
    if (rank >= 0 && rank != mpi_rank)
      return std::string(g.rank_var) + "=" + std::to_string(rank) + " but the MPI rank is " +
             std::to_string(mpi_rank) + " (launcher variables disagree with MPI: was the job started " +
             "with the launcher matching this MPI, e.g. srun --mpi=pmix or mpirun?)";
    if (size >= 0 && size != mpi_size)
      return std::string(g.size_var) + "=" + std::to_string(size) + " but the MPI world has " +
             std::to_string(mpi_size) + " ranks";
    if (local >= 0) {
      if (local >= mpi_size)
        return std::string(g.local_var) + "=" + std::to_string(local) + " is not below the world size " +
               std::to_string(mpi_size);
      if (found.local_rank >= 0 && local != found.local_rank)
        return std::string(g.local_var) + "=" + std::to_string(local) + " disagrees with " +
               found.local_rank_var + "=" + std::to_string(found.local_rank);
      if (found.local_rank < 0) {
        found.local_rank = local;
        found.local_rank_var = g.local_var;
      }
    }
    if (found.launcher == "none" && rank >= 0) {
      found.launcher = launcher;
      found.rank = rank;
      found.size = size;
    }
  }
  if (found.local_rank < 0) found.local_rank = mpi_rank;  // one node assumed
  *out = found;
  return "";
}

}  // namespace spindle::exec
