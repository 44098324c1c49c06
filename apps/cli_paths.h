// What the apps' command lines share beyond CLI11 itself.
#pragma once

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "libplan/util/parallel.h"

namespace spindle::apps {

// SPINDLE_PLAN_THREADS set, but not to a number of threads from 1 to 1024
// (libplan/util/parallel.h): the usage error's message; empty when unset or
// valid. spindle-plan and spindle-profile (whose --measure plans) refuse it
// with exit 2, rather than plan on every hardware thread.
inline std::string plan_threads_env_error() {
  if (!spindle::plan::plan_threads_env_invalid()) return {};
  return std::string("SPINDLE_PLAN_THREADS=") + std::getenv("SPINDLE_PLAN_THREADS") +
         ": expected a number of threads from 1 to 1024 (unset: one per hardware thread)";
}

#ifndef SPINDLE_VERSION
#define SPINDLE_VERSION "unknown"
#endif

// --version: "PROGRAM VERSION" on stdout, exit 0 (the project's version,
// set by apps/CMakeLists.txt from CMakeLists.txt's project()).
inline void add_version_flag(CLI::App& app, const std::string& program) {
  app.set_version_flag("--version", program + " " SPINDLE_VERSION, "print the version and exit");
}

// A usage error CLI11 finds ("--steps x", a missing MODEL) reads as the
// program's own errors do: "PROGRAM: error: MESSAGE" on stderr, then
// CLI11's hint to --help. Without it CLI11 prints the bare message
// ("Could not convert: --steps = x"), which a log's reader or a grep for
// "error:" cannot tell from other output.
inline void prefix_usage_errors(CLI::App& app, const std::string& program) {
  app.failure_message([program](const CLI::App* a, const CLI::Error& e) {
    return program + ": error: " + CLI::FailureMessage::simple(a, e);
  });
}

// Standard output checked as the program ends (as coreutils' close_stdout):
// a summary that could not be written (a full disk, `> /dev/full`) ends
// with a message and exit 1, not exit 0. Registered once (init_app).
inline std::string& program_name() {
  static std::string name;
  return name;
}
inline void check_stdout_at_exit() {
  const bool flushed = std::fflush(stdout) == 0;
  if (flushed && !std::ferror(stdout)) return;
  std::fprintf(stderr, "%s: error: writing standard output: %s\n", program_name().c_str(),
               flushed ? "a write failed" : std::strerror(errno));
  std::_Exit(1);
}

// What every program's command line starts with: --version, the error
// prefix, and the check of standard output at exit.
inline void init_app(CLI::App& app, const std::string& program) {
  add_version_flag(app, program);
  prefix_usage_errors(app, program);
  if (program_name().empty()) std::atexit(check_stdout_at_exit);
  program_name() = program;
}

// What an empty value is refused with, whichever check meets it first.
inline std::string empty_message(const std::string& what) {
  return "empty " + what + " (an unset variable in a script?)";
}

// Refuses an empty value as "empty WHAT (an unset variable in a
// script?)"; `desc` and `name` are CLI11's (the help's type tag, the
// validator's name).
inline CLI::Validator non_empty(const std::string& what, const std::string& desc, const std::string& name) {
  return CLI::Validator(
      [what](std::string& value) { return value.empty() ? empty_message(what) : std::string(); }, desc, name);
}

// For every option that takes a path: an empty value ("--data ''", or
// "--data $DATA" in a job script where DATA is unset) is a usage error
// (exit 2), not the option left out. Read as "not given", it would train
// on synthetic data instead of the data named, or write no trace, and
// exit 0.
inline CLI::Validator non_empty_path() { return non_empty("path", "PATH", "non-empty path"); }

// For every option that takes a value, called once all are added: an
// empty value ("--clip-grad $CLIP" in a job script where CLIP is unset) is
// a usage error (exit 2). CLI11 alone reads "" as 0 for a number, so that
// run would train unclipped, or without weight decay, and exit 0. Path
// options keep their own message (non_empty_path, checked first).
inline void refuse_empty_values(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_type_size() == 0) continue;   // a flag: takes no value
    opt->check(non_empty("value", "", "non-empty value"));
  }
}

// For an unsigned 64-bit option (--seed): decimal digits only, at most
// 2^64 - 1. CLI11 alone would read "99999999999999999999" as 2^64 - 1 (its
// conversion saturates instead of failing) and "0x10" as 16, so a typo
// would train from another seed than the one written, silently.
inline CLI::Validator uint64_decimal() {
  return CLI::Validator(
      [](std::string& value) {
        if (value.empty()) return empty_message("value");
        uint64_t parsed = 0;
        const char* end = value.data() + value.size();
        const auto [ptr, ec] = std::from_chars(value.data(), end, parsed, 10);
        if (ec != std::errc() || ptr != end)
          return "expected a decimal integer in [0, " + std::to_string(std::numeric_limits<uint64_t>::max()) +
                 "], found '" + value + "'";
        return std::string();
      },
      "UINT", "unsigned 64-bit decimal");
}

// For an integer option with bounds (--eval-every, --lr-warmup-steps):
// decimal digits only, in [min, max]. CLI11's PositiveNumber and
// NonNegativeNumber would answer "Value 0 not in range 0.000000 to" and
// the largest double in 309 digits.
inline CLI::Validator integer_in(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& value) {
        if (value.empty()) return empty_message("value");
        int64_t parsed = 0;
        const char* end = value.data() + value.size();
        const auto [ptr, ec] = std::from_chars(value.data(), end, parsed, 10);
        if (ec != std::errc() || ptr != end || parsed < min || parsed > max)
          return "expected an integer from " + std::to_string(min) + " to " + std::to_string(max) + ", found '" +
                 value + "'";
        return std::string();
      },
      "INT", "integer in range");
}

// A range of training steps, numbered as --metrics numbers them (from 1),
// both ends included.
struct StepRange {
  int64_t first = 1;
  int64_t last = std::numeric_limits<int64_t>::max();
};

// "FIRST:LAST", "FIRST:" (to the run's end) or "FIRST" (that step alone):
// decimal digits only, FIRST at least 1, LAST at least FIRST. Empty when
// the text is anything else.
inline std::optional<StepRange> parse_step_range(const std::string& value) {
  auto number = [](const char* begin, const char* end, int64_t& out) {
    const auto [ptr, ec] = std::from_chars(begin, end, out, 10);
    return begin != end && ec == std::errc() && ptr == end && *begin != '-' && *begin != '+';
  };
  const char* begin = value.data();
  const char* end = begin + value.size();
  const size_t colon = value.find(':');
  const char* first_end = colon == std::string::npos ? end : begin + colon;
  StepRange r;
  if (!number(begin, first_end, r.first) || r.first < 1) return std::nullopt;
  if (colon == std::string::npos) r.last = r.first;
  else if (first_end + 1 != end && !number(first_end + 1, end, r.last)) return std::nullopt;
  if (r.last < r.first) return std::nullopt;
  return r;
}

// For --trace-steps: a StepRange as parse_step_range reads it.
inline CLI::Validator step_range() {
  return CLI::Validator(
      [](std::string& value) {
        return parse_step_range(value)
                   ? std::string()
                   : "expected FIRST:LAST, FIRST: or FIRST (steps from 1, LAST not before FIRST), found '" + value + "'";
      },
      "FIRST:LAST", "range of steps");
}

}  // namespace spindle::apps
