// The cluster description (spec/cluster.md).
#pragma once

#include <cstdint>
#include <string>

#include "libplan/rules/links.h"
#include "libplan/util/status.h"

namespace spindle::plan {


struct Cluster {
  std::string name;
  int islands = 0;
  int devices_per_island = 0;
  std::string device_name;
  double memory_gib = 0;              // usable device memory
  double peak_tflops = 0;             // dense peak for the model's dtype
  double memory_gbytes_per_s = 0;     // 0 when not given (analytic profiles need it)
  int device_line = 0, device_column = 0;   // where the `device` map starts in the file (1-based; 0: unknown)
  Link intra_island;
  Link inter_island;
  std::string path;
  std::string sha256;

  int devices() const { return islands * devices_per_island; }
  int island_of(int device) const { return plan::island_of(device, devices_per_island); }
  int64_t memory_bytes() const;       // memory_gib * 2^30, rounded down
};

Result<Cluster> parse_cluster_string(const std::string& yaml_text, const std::string& path);
Result<Cluster> load_cluster(const std::string& path);

}  // namespace spindle::plan
