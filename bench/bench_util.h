// Small helpers shared by the bench programs: timing, medians and the
// date/machine line that every results file starts with.
#pragma once

#include <sys/utsname.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace spindle::bench {

// Milliseconds that `fn()` took, on the steady clock.
template <class Fn>
double time_ms(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The median of `values` (the mean of the middle two for an even count); 0
// when empty.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t m = values.size() / 2;
  return values.size() % 2 ? values[m] : 0.5 * (values[m - 1] + values[m]);
}

// Today's date in UTC, "YYYY-MM-DD".
inline std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

// "CPU MODEL, N hardware threads, Linux RELEASE x86_64": what planning
// times were measured on.
inline std::string machine_line() {
  std::string cpu = "unknown CPU";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  std::string out = cpu + ", " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads";
  utsname u{};
  if (uname(&u) == 0) out += std::string(", ") + u.sysname + " " + u.release + " " + u.machine;
  return out;
}

}  // namespace spindle::bench
