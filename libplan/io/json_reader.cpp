#include "libplan/io/json_reader.h"

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "libplan/util/limits.h"
#include "libplan/util/text.h"

namespace spindle::plan {

Status check_json_shape(const std::string& text, const std::string& path) {
  if (static_cast<int64_t>(text.size()) > limits::kMaxJsonBytes) {
    return Error{path + ": " + std::to_string(text.size()) + " bytes, more than the " +
                 std::to_string(limits::kMaxJsonBytes >> 20) + " MiB a JSON input may have"};
  }
  // One pass, no recursion: nesting depth outside strings.
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limits::kMaxNestingDepth) {
        return Error{path + ": nested more than " + std::to_string(limits::kMaxNestingDepth) +
                     " arrays or objects deep (byte " + std::to_string(i) + ")"};
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return Status::Ok();
}

namespace {

// A SAX pass over a document that parsed: the first key given twice in one
// object, or the first string (key or value) with a control character,
// named by its key path. Linear in the text: each object keeps the keys
// it has seen until it ends. (The parser's callback did this before
// 2026-12-07, and nlohmann's callback parser scans the enclosing array
// after every object it ends: an array of 400000 small objects in a 4 MB
// profile took 55 s.)
class KeyCheck {
 public:
  using json = nlohmann::json;
  std::string problem;   // empty: none found

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool string(json::string_t& value) { return clean(value, value_path()); }
  bool start_object(std::size_t) {
    levels_.push_back({true, value_path(), {}});
    return true;
  }
  bool key(json::string_t& key) {
    key_ = key;
    if (!clean(key, value_path())) return false;
    if (!levels_.back().keys.insert(key).second) {
      problem = value_path() + ": a key given twice in one object (JSON readers keep one of the two values "
                "without a word; give it once)";
      return false;
    }
    return true;
  }
  bool end_object() {
    levels_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    levels_.push_back({false, value_path(), {}});
    return true;
  }
  bool end_array() {
    levels_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }

 private:
  struct Level {
    bool object = false;
    std::string path;   // its own key path ("" at the top)
    std::set<std::string> keys;
  };
  std::vector<Level> levels_;
  std::string key_;   // the last key read in the innermost object

  // The key path of the value about to be read: `entries[].points[].ms`.
  std::string value_path() const {
    if (levels_.empty()) return "";
    const Level& l = levels_.back();
    if (!l.object) return l.path + "[]";
    return l.path.empty() ? key_ : l.path + "." + key_;
  }
  // No control character (a NUL cuts a message short where it is printed,
  // an ESC or newline writes into the terminal): as the YAML readers.
  bool clean(const std::string& text, const std::string& where) {
    const size_t at = control_char_at(text);
    if (at == std::string::npos) return true;
    problem = (where.empty() ? std::string("the document") : where) +
              ": expected a string without control characters, found byte " +
              std::to_string(static_cast<unsigned char>(text[at])) + " (an escape such as \\u0000 or \\n)";
    return false;
  }
};

}  // namespace

Result<nlohmann::json> parse_json_text(const std::string& text, const std::string& path) {
  SPINDLE_TRY(check_json_shape(text, path));
  try {
    nlohmann::json doc = nlohmann::json::parse(text);
    // Duplicate keys: JSON allows them and nlohmann keeps the last, so
    // {"ms": 1e9, "ms": 0.13} read as 0.13 without a word.
    KeyCheck check;
    nlohmann::json::sax_parse(text, &check);
    if (!check.problem.empty()) return Error{path + ": " + check.problem};
    return doc;
  } catch (const nlohmann::json::parse_error& e) {
    return Error{path + ": not valid JSON (byte " + std::to_string(e.byte) + "): " + e.what()};
  } catch (const nlohmann::json::exception& e) {  // e.g. out_of_range: a number too large for a double
    return Error{path + ": not valid JSON: " + e.what()};
  }
}

JsonReader JsonReader::at(const std::string& name) const {
  static const nlohmann::json kNull;
  std::string k = key_.empty() ? name : key_ + "." + name;
  if (!v_.is_object() || !v_.contains(name)) return JsonReader(kNull, file_, k);
  return JsonReader(v_.at(name), file_, k);
}

JsonReader JsonReader::at(size_t index) const {
  static const nlohmann::json kNull;
  std::string k = key_ + "[" + std::to_string(index) + "]";
  if (!v_.is_array() || index >= v_.size()) return JsonReader(kNull, file_, k);
  return JsonReader(v_.at(index), file_, k);
}

Status JsonReader::require_map() const {
  if (!v_.is_object()) return error(std::string("expected an object, found ") + v_.type_name());
  return Status::Ok();
}

Status JsonReader::require_object(std::initializer_list<const char*> required,
                                  std::initializer_list<const char*> optional) const {
  SPINDLE_TRY(require_map());
  std::set<std::string> known;
  for (const char* r : required) {
    known.insert(r);
    if (!v_.contains(r)) return error(std::string("missing required key '") + r + "'");
  }
  for (const char* o : optional) known.insert(o);
  for (const auto& [name, _] : v_.items()) {
    if (known.count(name) || name == "x" || name.rfind("x-", 0) == 0) continue;
    return at(name).error("unknown key (expected one of the format's keys; extensions go under 'x' or 'x-*')");
  }
  return Status::Ok();
}

Status JsonReader::require_array() const {
  if (!v_.is_array()) return error(std::string("expected an array, found ") + v_.type_name());
  return Status::Ok();
}

Result<std::string> JsonReader::get_string() const {
  if (!v_.is_string()) return error(std::string("expected a string, found ") + v_.type_name());
  return v_.get<std::string>();
}

Result<int64_t> JsonReader::get_int() const {
  if (!v_.is_number_integer()) return error(std::string("expected an integer, found ") + v_.dump());
  if (v_.is_number_unsigned() && v_.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
    return error("integer " + v_.dump() + " is out of range");
  }
  return v_.get<int64_t>();
}

Result<int64_t> JsonReader::get_int_in(int64_t lo, int64_t hi) const {
  SPINDLE_ASSIGN(v, get_int());
  if (v < lo || v > hi)
    return error("expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + ", found " +
                 std::to_string(v));
  return v;
}

Result<double> JsonReader::get_number() const {
  if (!v_.is_number()) return error(std::string("expected a number, found ") + v_.dump());
  double d = v_.get<double>();
  if (!std::isfinite(d)) return error("expected a finite number");
  return d;
}

Result<bool> JsonReader::get_bool() const {
  if (!v_.is_boolean()) return error(std::string("expected true or false, found ") + v_.dump());
  return v_.get<bool>();
}

Status check_format_version(const JsonReader& doc, const std::string& format, int max_version) {
  auto f = doc.at("format").get_string();
  if (!f.ok()) return f.error();
  if (*f != format) return doc.at("format").error("expected \"" + format + "\", found \"" + *f + "\"");
  auto v = doc.at("version").get_int();
  if (!v.ok()) return v.error();
  if (*v < 1) return doc.at("version").error("expected a version >= 1, found " + std::to_string(*v));
  if (*v > max_version)
    return doc.at("version").error("version " + std::to_string(*v) + " is newer than this Spindle reads (" +
                                   std::to_string(max_version) + "); upgrade Spindle or regenerate the file");
  return Status::Ok();
}

double round_to(double value, int decimals) {
  double scale = std::pow(10.0, decimals);
  double r = std::round(value * scale) / scale;
  return r == 0.0 ? 0.0 : r;  // no "-0.0"
}

}  // namespace spindle::plan
