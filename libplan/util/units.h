// Byte counts for people, in the binary units the tools print.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>

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

// `x` as the shortest decimal that reads back as the same value, in plain
// notation from 1e-6 up to 1e21 and in scientific notation outside
// ("0.0009", "25", "1048576", "1e-30", "1e+300", "nan", "inf"), as
// JavaScript prints numbers: for echoing a number a user gave in an error
// message, where std::to_string's six fixed decimals print 1e-30 as
// "0.000000" and 1e300 as 301 digits. A float prints as the float it is
// (1e30f as "1e+30", not the double it widens to).
template <typename T>
  requires std::is_floating_point_v<T>
std::string number_text(T x) {
  const T a = std::fabs(x);
  const bool plain = !std::isfinite(x) || a == 0 || (a >= T(1e-6) && a < T(1e21));
  char buf[64];
  const auto [end, ec] =
      std::to_chars(buf, buf + sizeof buf, x, plain ? std::chars_format::fixed : std::chars_format::scientific);
  return ec == std::errc{} ? std::string(buf, end) : std::string("?");
}

}  // namespace spindle::plan
