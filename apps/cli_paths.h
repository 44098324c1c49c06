// What the apps' command lines share beyond CLI11 itself.
#pragma once

#include <charconv>
#include <cstdint>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>

namespace spindle::apps {

// For every option that takes a path: an empty value ("--data ''", or
// "--data $DATA" in a job script where DATA is unset) is a usage error
// (exit 2), not the option left out. Read as "not given", it would train
// on synthetic data instead of the data named, or write no trace, and
// exit 0.
inline CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& value) {
        return value.empty() ? std::string("empty path (an unset variable in a script?)") : std::string();
      },
      "PATH", "non-empty path");
}

// For an unsigned 64-bit option (--seed): decimal digits only, at most
// 2^64 - 1. CLI11 alone would read "99999999999999999999" as 2^64 - 1 (its
// conversion saturates instead of failing) and "0x10" as 16, so a typo
// would train from another seed than the one written, silently.
inline CLI::Validator uint64_decimal() {
  return CLI::Validator(
      [](std::string& value) {
        uint64_t parsed = 0;
        const char* end = value.data() + value.size();
        const auto [ptr, ec] = std::from_chars(value.data(), end, parsed, 10);
        if (value.empty() || ec != std::errc() || ptr != end)
          return "expected a decimal integer in [0, " + std::to_string(std::numeric_limits<uint64_t>::max()) +
                 "], found '" + value + "'";
        return std::string();
      },
      "UINT", "unsigned 64-bit decimal");
}

}  // namespace spindle::apps
