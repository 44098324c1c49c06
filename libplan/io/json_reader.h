// Strict reading of JSON documents for the file formats (profile, plan):
// every access records its key path, so errors name the file and the key,
// and unknown keys are rejected (spec/README.md) except `x` and `x-*`.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

#include "libplan/util/status.h"

namespace spindle::plan {

// The reader policy for JSON inputs (docs/hardening.md, "Limits"): at most
// limits::kMaxJsonBytes bytes and limits::kMaxNestingDepth nested arrays or
// objects, checked in one pass without recursion before anything is parsed,
// so no later step (copy, dump, compare) can recurse deeper than that.
Status check_json_shape(const std::string& text, const std::string& path);

// Parses text after check_json_shape; error names the file and the byte
// offset of a syntax error.
Result<nlohmann::json> parse_json_text(const std::string& text, const std::string& path);

// A read cursor over one JSON value, carrying the file name and key path.
class JsonReader {
 public:
  JsonReader(const nlohmann::json& value, std::string file, std::string key = "")
      : v_(value), file_(std::move(file)), key_(std::move(key)) {}

  const nlohmann::json& value() const { return v_; }
  const std::string& key() const { return key_; }
  Error error(const std::string& what) const { return make_error({file_, key_, 0, 0}, what); }

  // Child cursors. The parent must be an object/array (checked by require_*).
  JsonReader at(const std::string& name) const;
  JsonReader at(size_t index) const;

  Status require_object(std::initializer_list<const char*> required,
                        std::initializer_list<const char*> optional) const;
  Status require_array() const;
  // An object whose keys are free names (tasks, tensors): any keys.
  Status require_map() const;
  bool has(const std::string& name) const { return v_.is_object() && v_.contains(name); }

  Result<std::string> get_string() const;
  Result<int64_t> get_int() const;
  // get_int within [lo, hi]; outside it, an error naming both bounds.
  Result<int64_t> get_int_in(int64_t lo, int64_t hi) const;
  Result<double> get_number() const;
  Result<bool> get_bool() const;

 private:
  const nlohmann::json& v_;
  std::string file_;
  std::string key_;
};

// Checks `format` and `version` of a top-level document: another format is an
// error; a newer version is an error with a hint to upgrade Spindle.
Status check_format_version(const JsonReader& doc, const std::string& format, int max_version);

// Rounds to `decimals` decimal places, so that written floats are short and
// re-reading and re-writing gives the same bytes.
double round_to(double value, int decimals);

}  // namespace spindle::plan
