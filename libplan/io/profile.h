// The profile database (spec/profile.md): reader and writer in one place.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "libplan/graph/op_graph.h"
#include "libplan/model/cluster.h"
#include "libplan/util/status.h"

namespace spindle::plan {

// Profiles are written as version 1, the format docs/spec/profile.md fixes,
// with this project's additions under extension keys, which every reader
// of version 1 skips: "x-cluster" (the cluster the profile was made for),
// "x-comm_overhead" (the runtime's software cost around messages and
// collectives), a point's "x-spread", and "x-links", "x-compute",
// "x-optimizer", an entry's "x-forward_share". Builds from 2026-11 to
// 2026-12-07 wrote the first two as version 2 ("cluster") and version 3
// (also "comm_overhead", and "spread"): those files stay readable, with
// the same meaning. A file of a version above kProfileNewestVersion is
// refused.
inline constexpr int kProfileVersion = 1;
inline constexpr int kProfileNewestVersion = 3;

// The bounds of Profile::compute_scale in a file.
inline constexpr double kMinComputeScale = 0.25;
inline constexpr double kMaxComputeScale = 4.0;

struct ProfilePoint {
  int devices = 0;
  double ms = 0;        // one operator, forward + backward, local batch batch/n
  double spread = 0;    // measured only: relative spread of the repeats (0 = not given)
};

struct ProfileEntry {
  Workload workload;
  std::vector<ProfilePoint> points;     // devices strictly increasing
  int64_t param_bytes = 0;              // in the model's dtype
  int64_t activation_bytes_per_sample = 0;
  std::string source;                   // per-entry source when the file mixes; else ""
  // Share of each point's ms spent in the forward, in [0, 1]: measured by
  // spindle-profile --measure (extension key "x-forward_share",
  // docs/profiling.md); -1 when the entry does not say (the simulation
  // then takes SimOptions::forward_share, a third).
  double forward_share = -1;
};

// Link figures measured by `spindle-profile --measure` under mpirun
// (extension key "x-links", docs/profiling.md): least-squares fits of
// t = latency + bytes / bandwidth. A Link with gbytes_per_s == 0 was not
// measured (the cluster's figure stays in use). p2p: one send/recv;
// allreduce: the ring model of spec/cluster.md fitted to timed all-reduces.
struct ProfileLinks {
  Link intra_p2p, inter_p2p;
  Link intra_allreduce, inter_allreduce;
  int ranks = 0;                        // MPI ranks that measured them
  // "progress": "calls": the runtime's all-reduces move only inside its
  // communicator's calls and polls (MPI, the CPU backend's); absent or
  // "background": beside compute (NCCL). docs/simulation.md.
  bool progress_in_calls = false;
};

// The cluster a profile was made for ("x-cluster"; "cluster" of a version 2
// or 3 file).
struct ProfileCluster {
  std::string name;
  int devices = 0;
  int devices_per_island = 0;
};

struct Profile {
  std::string device;
  std::optional<ProfileCluster> cluster;  // absent in older version 1 files and when unknown
  std::string source;                   // "analytic" | "measured" (| "mixed": a version 2 or 3 file)
  std::vector<ProfileEntry> entries;    // sorted by Workload::key() when written
  std::optional<ProfileLinks> links;    // "x-links"; absent unless measured under mpirun
  std::optional<CommOverhead> overhead; // "x-comm_overhead" ("comm_overhead" of version 3); absent in older files
  // "x-optimizer": {"gbytes_per_s": R}: the rate of the optimizer step, in
  // bytes of rules/memory.h's kAdamWBytesPerValue per value stepped per
  // second (1e9 per GB). Analytic profiles: the device's memory bandwidth;
  // spindle-profile --measure: the backend's AdamW timed (docs/profiling.md).
  // Absent (older files): the optimizer step is not priced.
  std::optional<double> optimizer_gbytes_per_s;
  // "x-compute": {"in_step_scale": S}: how much longer the operators took
  // inside spindle-run's steps than timed alone, measured by spindle-profile
  // --measure under mpirun with a host backend (docs/profiling.md). The
  // points keep their times alone; the cost model multiplies every point's
  // ms by S (ProfileCostModel::create). In [kMinComputeScale,
  // kMaxComputeScale]. Absent: 1.
  std::optional<double> compute_scale;
  std::string path;
  std::string sha256;                   // of the file's bytes ("" if built in memory)

  // nullptr when no entry has this workload.
  const ProfileEntry* find(const Workload& w) const;
};

// Rejects another `format`, a newer `version` (with a hint), unknown keys,
// points not strictly increasing. Messages name the file and key path.
Result<Profile> parse_profile_string(const std::string& json_text, const std::string& path);
Result<Profile> load_profile(const std::string& path);

// How the profile's device and cluster differ from `cluster`, one line each
// (empty when they agree). A profile without a cluster (older files) is
// compared by its device only.
std::vector<std::string> profile_mismatches(const Profile& profile, const Cluster& cluster);

// A figure of the profile (a point's ms, a link's or overhead's number) as
// the file stores it: 6 significant digits. Profiles made in memory round
// their figures so too (analytic_profile), so planning from a file that
// spindle-profile wrote gives exactly the plan made from the profile in
// memory: the planner's greedy steps can turn a difference in the 7th
// digit into another schedule (multitask-clip-10 on a800-4x8: 204.9 against
// 218.1 ms before both rounded alike).
double profile_figure(double v);

// Deterministic bytes, always version 1 (kProfileVersion; the cluster
// and overhead figures under their extension keys, when the profile has
// them): sorted keys, entries sorted by workload key, fixed float
// formatting. encode(decode(encode(p))) == encode(p). A profile read from
// a legacy "mixed" file is written with the file's source "measured" (its
// entries name their own).
std::string profile_to_json(const Profile& profile);

}  // namespace spindle::plan
