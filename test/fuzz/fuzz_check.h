// Shared by the fuzz targets (docs/hardening.md). Each target defines
// LLVMFuzzerTestOneInput: any input must either parse or give an Error value;
// it must never crash, hang or let an exception out. A broken contract prints
// what broke and aborts, which libFuzzer reports as a crash and saves as a
// reproducer (keep it in test/fuzz/corpus/<target>/ as a regression input).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace spindle::fuzz {

// The file name every target passes to the reader; errors must name it.
inline const std::string kPath = "fuzz-input";

// Aborts with `what` (and `detail`) unless `ok`.
inline void require(bool ok, const char* what, const std::string& detail = "") {
  if (ok) return;
  std::fprintf(stderr, "fuzz: contract broken: %s\n%s\n", what, detail.c_str());
  std::abort();
}

// An error message starts with the file it is about (libplan/util/status.h)
// and says something after it.
inline void require_error_names_file(const std::string& message) {
  require(message.rfind(kPath, 0) == 0 && message.size() > kPath.size() + 2,
          "an error message must start with the file name", message);
}

}  // namespace spindle::fuzz
