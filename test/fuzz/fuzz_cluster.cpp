// Fuzz target of the cluster reader (parse_cluster_string). A cluster it
// accepts must give a positive device count and memory size without overflow
// (UBSan checks the conversions).
#include <cstddef>
#include <cstdint>
#include <string>

#include "libplan/model/cluster.h"
#include "test/fuzz/fuzz_check.h"

using namespace spindle;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  plan::Result<plan::Cluster> cluster = plan::parse_cluster_string(text, fuzz::kPath);
  if (!cluster.ok()) {
    fuzz::require_error_names_file(cluster.error().message);
    return 0;
  }
  const plan::Cluster& c = *cluster;
  fuzz::require(c.devices() >= 1, "a cluster has at least one device");
  fuzz::require(c.island_of(c.devices() - 1) == c.islands - 1, "the last device is on the last island");
  fuzz::require(c.memory_bytes() > 0, "a device has memory");
  return 0;
}
