// Helpers shared by the reader regression tests (test_hostile.cpp,
// test_reader_limits.cpp): the whole file and the message of a failed read.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "libplan/util/files.h"
#include "libplan/util/status.h"

namespace spindle::plan::testing {

// The bytes of `path`, which must be readable.
inline std::string slurp(const std::string& path) {
  auto r = read_file(path);
  REQUIRE(r.ok());
  return *r;
}

// The error message of `r`, which must have failed.
template <class T>
std::string error_of(const Result<T>& r) {
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

}  // namespace spindle::plan::testing
