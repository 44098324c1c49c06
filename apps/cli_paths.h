// What the apps' command lines share beyond CLI11 itself.
#pragma once

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

}  // namespace spindle::apps
