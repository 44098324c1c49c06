// Byte counts for people, in the binary units the tools print.
#pragma once

#include <cstdio>
#include <string>

namespace spindle::plan {

// `bytes` in the largest of GiB, MiB and KiB that it reaches, with
// `decimals` decimals ("80.0 GiB", "2.31 MiB"), or in bytes below 1 KiB
// ("12 B").
inline std::string human_bytes(double bytes, int decimals = 1) {
  static constexpr const char* kUnits[] = {"GiB", "MiB", "KiB"};
  double scale = static_cast<double>(1u << 30);
  char buf[48];
  for (const char* unit : kUnits) {
    if (bytes >= scale || bytes <= -scale) {
      std::snprintf(buf, sizeof buf, "%.*f %s", decimals, bytes / scale, unit);
      return buf;
    }
    scale /= 1024;
  }
  std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  return buf;
}

}  // namespace spindle::plan
