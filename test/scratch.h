// A scratch folder for tests: one fresh, empty folder under the system temp
// folder, made unique by mkdtemp (spindle-TAG-XXXXXX), so that a folder
// another user's or another checkout's run left there, or is using, is
// never this one. Removed, with what it holds, at scope end.
#pragma once

#include <stdlib.h>   // mkdtemp

#include <filesystem>
#include <string>
#include <system_error>

#include <catch2/catch.hpp>

namespace spindle::testutil {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    std::string t = (std::filesystem::temp_directory_path() / ("spindle-" + tag + "-XXXXXX")).string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
  // The path of `name` inside the folder.
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace spindle::testutil
