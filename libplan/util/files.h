// File helpers shared by every reader and writer.
#pragma once

#include <string>

#include "libplan/util/status.h"

namespace spindle::plan {

// Reads a whole file. Error names the file and the OS reason.
Result<std::string> read_file(const std::string& path);

// Writes `bytes` to `path` atomically: a temporary file in the same folder,
// flushed, then renamed over `path`. On error nothing at `path` changes and
// the temporary is removed.
Status write_file_atomic(const std::string& path, const std::string& bytes);

// Lower-case hex SHA-256 of `bytes` (OpenSSL).
std::string sha256_hex(const std::string& bytes);

}  // namespace spindle::plan
