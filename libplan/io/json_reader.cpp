#include "libplan/io/json_reader.h"

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "libplan/util/limits.h"

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

Result<nlohmann::json> parse_json_text(const std::string& text, const std::string& path) {
  SPINDLE_TRY(check_json_shape(text, path));
  // Duplicate keys: JSON allows them and nlohmann keeps the last, so
  // {"ms": 1e9, "ms": 0.13} read as 0.13 without a word. Each object's keys
  // are tracked while parsing (the nesting is bounded above).
  using Event = nlohmann::json::parse_event_t;
  struct Level {
    bool object = false;
    std::string name;   // its key in the object holding it, "[]" in an array
    std::set<std::string> keys;
  };
  std::vector<Level> levels;
  std::string key, duplicate;
  auto track = [&](int, Event event, nlohmann::json& parsed) {
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        levels.push_back({event == Event::object_start, levels.empty() || !levels.back().object ? "[]" : key, {}});
        break;
      case Event::object_end:
      case Event::array_end:
        if (!levels.empty()) levels.pop_back();
        break;
      case Event::key:
        key = parsed.get<std::string>();
        if (duplicate.empty() && !levels.empty() && !levels.back().keys.insert(key).second) {
          for (size_t i = 1; i < levels.size(); ++i)
            duplicate += levels[i].name == "[]" ? "[]" : (duplicate.empty() ? "" : ".") + levels[i].name;
          duplicate += (duplicate.empty() ? "" : ".") + key;
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    nlohmann::json doc = nlohmann::json::parse(text, track);
    if (!duplicate.empty())
      return Error{path + ": " + duplicate + ": a key given twice in one object (JSON readers keep one of the two "
                   "values without a word; give it once)"};
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
