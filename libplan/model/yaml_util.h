// Strict YAML reading helpers shared by the model and cluster parsers
// (internal to libplan/model). Every helper returns an Error naming the file,
// the key path and the 1-based line and column (spec/README.md); none throws.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "libplan/model/model.h"
#include "libplan/util/files.h"
#include "libplan/util/limits.h"
#include "libplan/util/status.h"
#include "libplan/util/text.h"

namespace spindle::plan::yamlu {

// 1-based position of `node`; {0, 0} when yaml-cpp has none.
inline Mark mark_of(const YAML::Node& node) {
  if (!node.IsDefined()) return {};
  const YAML::Mark m = node.Mark();
  if (m.is_null()) return {};
  return {m.line + 1, m.column + 1};
}

// "a.b" / "b" key paths and "a[3]".
inline std::string child(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}
inline std::string index(const std::string& path, std::size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

// Keys free for extensions and comments (spec/README.md).
inline bool is_extension_key(const std::string& key) {
  return key == "x" || key.rfind("x-", 0) == 0;
}

// A short description of what was found, for "expected X, found Y".
inline std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing (an empty value)";
  if (node.IsMap()) return node.size() == 0 ? "an empty map" : "a map";
  if (node.IsSequence()) return node.size() == 0 ? "an empty list" : "a list";
  std::string s = node.Scalar();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  const std::string& tag = node.Tag();
  if (tag == "!") return "the quoted string '" + s + "'";
  if (tag == "?" || tag.empty()) return "'" + s + "'";
  const std::string core = "tag:yaml.org,2002:";
  return "'" + s + "' tagged " + (tag.rfind(core, 0) == 0 ? "!!" + tag.substr(core.size()) : tag);
}

// Whether scalar `node` is written plainly (untagged, unquoted) or with
// one of `core` YAML's core tags (!!int, !!float, !!bool): `batch: !!str 24`
// is a string, as `batch: "24"` is.
inline bool plain_or_tagged(const YAML::Node& node, std::initializer_list<const char*> core) {
  const std::string& tag = node.Tag();
  if (tag == "?" || tag.empty()) return true;
  for (const char* c : core)
    if (tag == std::string("tag:yaml.org,2002:") + c) return true;
  return false;
}

// Offset of the first byte of `text` that is not valid UTF-8 (overlong
// forms, surrogates and code points above U+10FFFF included); npos if none.
inline std::size_t invalid_utf8_at(const std::string& text) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    std::size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (std::size_t k = 1; k < len; ++k) {
      if ((b[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (b[i + k] & 0x3F);
    }
    const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string::npos;
}

struct Entry {
  YAML::Node key;
  YAML::Node value;
};

// The entries of one YAML map, by key, plus their file order.
struct MapView {
  std::map<std::string, Entry> entries;
  std::vector<std::string> order;
  const Entry* find(const std::string& key) const {
    auto it = entries.find(key);
    return it == entries.end() ? nullptr : &it->second;
  }
};

// Reads values of one file; `file` goes into every message.
struct Reader {
  std::string file;

  Error error(const std::string& path, const YAML::Node& at, const std::string& what) const {
    const Mark m = mark_of(at);
    return make_error(Where{file, path, m.line, m.column}, what);
  }

  // Collects the entries of map `node`; keys must be unique scalars.
  Status view_map(const std::string& path, const YAML::Node& node, MapView& out) const {
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node key = it->first;
      if (!key.IsScalar()) {
        return error(path, key, "expected a plain key, found " + describe(key));
      }
      const std::string k = key.Scalar();
      // A merge key (`<<: *defaults`, YAML 1.1): yaml-cpp keeps it as a key
      // named "<<", so a map that took its required keys from it read as
      // missing them.
      if (k == "<<" && key.Tag() != "!") {
        return error(child(path, k), key,
                     "'<<' (a YAML merge key) is not read here (YAML 1.2 has no merge keys): write the keys out "
                     "in this map");
      }
      if (out.entries.count(k) != 0) {
        const Mark first = mark_of(out.entries[k].key);
        return error(child(path, k), key,
                     "duplicate key '" + k + "' (first given at line " +
                         std::to_string(first.line) + ")");
      }
      out.entries[k] = Entry{key, it->second};
      out.order.push_back(k);
    }
    return Status::Ok();
  }

  // Error on the first key (in file order) not in `allowed` and not an
  // extension key. `what` names the map's kind for the message.
  Status reject_unknown(const std::string& path, const MapView& view,
                        const std::set<std::string>& allowed, const std::string& what) const {
    for (const std::string& k : view.order) {
      if (allowed.count(k) != 0 || is_extension_key(k)) continue;
      std::string list;
      for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
      return error(child(path, k), view.find(k)->key,
                   "unknown key '" + k + "' for " + what + ", expected one of " + list +
                       " (or x / x-* for extensions)");
    }
    return Status::Ok();
  }

  // A scalar without control characters (a NUL or newline in a name or an
  // op would end up in ids, file names and messages).
  Status get_string(const std::string& path, const YAML::Node& node, std::string& out) const {
    if (!node.IsScalar()) return error(path, node, "expected a string, found " + describe(node));
    if (invalid_utf8_at(node.Scalar()) != std::string::npos) {
      return error(path, node, "expected a string of valid UTF-8 (an escape gave a lone surrogate?)");
    }
    if (const std::size_t at = control_char_at(node.Scalar()); at != std::string::npos) {
      return error(path, node,
                   "expected a string without control characters, found byte " +
                       std::to_string(static_cast<unsigned char>(node.Scalar()[at])));
    }
    out = node.Scalar();
    return Status::Ok();
  }

  // A plain (unquoted) decimal integer.
  Status get_int(const std::string& path, const YAML::Node& node, int64_t& out) const {
    const std::string s = node.IsScalar() ? node.Scalar() : std::string();
    bool ok = node.IsScalar() && plain_or_tagged(node, {"int"}) && !s.empty() && s.size() <= 18;
    for (std::size_t i = 0; ok && i < s.size(); ++i) {
      const bool sign = i == 0 && (s[i] == '-' || s[i] == '+') && s.size() > 1;
      ok = sign || (s[i] >= '0' && s[i] <= '9');
    }
    if (!ok) return error(path, node, "expected an integer, found " + describe(node));
    out = std::strtoll(s.c_str(), nullptr, 10);
    return Status::Ok();
  }

  // A plain (unquoted) finite number.
  Status get_number(const std::string& path, const YAML::Node& node, double& out) const {
    bool ok = node.IsScalar() && plain_or_tagged(node, {"int", "float"}) && !node.Scalar().empty();
    if (ok) {
      const std::string s = node.Scalar();
      char* end = nullptr;
      errno = 0;
      out = std::strtod(s.c_str(), &end);
      ok = end == s.c_str() + s.size() && errno == 0 && std::isfinite(out) &&
           s.find_first_of("xXnN") == std::string::npos;  // no hex, nan, inf
      // A number written plainly but past a double (1e400), or so small it
      // loses precision (1e-320, subnormal): strtod's ERANGE.
      if (!ok && end == s.c_str() + s.size() && errno == ERANGE && s.find_first_of("xXnN") == std::string::npos)
        return error(path, node,
                     "expected a number of magnitude 0 or 2.2250738585072014e-308 to 1.7976931348623157e+308, "
                     "found " + describe(node));
    }
    if (!ok) return error(path, node, "expected a number, found " + describe(node));
    return Status::Ok();
  }

  // true / false (YAML 1.2 core schema spellings).
  Status get_bool(const std::string& path, const YAML::Node& node, bool& out) const {
    const std::string s = node.IsScalar() && plain_or_tagged(node, {"bool"}) ? node.Scalar() : std::string();
    if (s == "true" || s == "True" || s == "TRUE") {
      out = true;
    } else if (s == "false" || s == "False" || s == "FALSE") {
      out = false;
    } else {
      return error(path, node, "expected true or false, found " + describe(node));
    }
    return Status::Ok();
  }
};

// The reader policy for YAML inputs (docs/hardening.md, "Limits"): events
// only, no tree is built; the handler stops the parse at the first sequence
// or map nested deeper than limits::kMaxNestingDepth, so yaml-cpp's own
// recursion never goes deeper than that.
class ShapeCheck : public YAML::EventHandler {
 public:
  struct TooDeep {
    YAML::Mark mark;
  };
  void OnDocumentStart(const YAML::Mark& m) override { last_document = m; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    enter(m);
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    enter(m);
  }
  void OnMapEnd() override { --depth_; }

  YAML::Mark last_document;  // where the latest document started

 private:
  void enter(const YAML::Mark& m) {
    if (++depth_ > limits::kMaxNestingDepth) throw TooDeep{m};
  }
  int depth_ = 0;
};

// Size, encoding, nesting depth and number of documents of `text` (one
// document of UTF-8, limits::kMaxYamlBytes, limits::kMaxNestingDepth), before
// any tree is built.
inline Status check_yaml_shape(const std::string& text, const std::string& path) {
  if (static_cast<int64_t>(text.size()) > limits::kMaxYamlBytes) {
    return Error{path + ": " + std::to_string(text.size()) + " bytes, more than the " +
                 std::to_string(limits::kMaxYamlBytes >> 20) + " MiB a YAML input may have"};
  }
  if (text.find('\0') != std::string::npos) {
    return make_error(Where{path, "", 0, 0},
                      "a NUL byte at byte " + std::to_string(text.find('\0')) + " (YAML text has none)");
  }
  // A carriage return alone (classic Mac line endings): yaml-cpp breaks no
  // line there, so the whole file read as one line and the message was
  // "found nothing (an empty value)". \r\n is fine.
  for (std::size_t i = text.find('\r'); i != std::string::npos; i = text.find('\r', i + 1)) {
    if (i + 1 < text.size() && text[i + 1] == '\n') continue;
    return make_error(Where{path, "", 0, 0}, "a carriage return without a line feed at byte " + std::to_string(i) +
                                                 " (old Mac line endings): save the file with \\n or \\r\\n line endings");
  }
  // Names end up in JSON files, which hold UTF-8 only (YAML is Unicode too).
  if (const std::size_t bad = invalid_utf8_at(text); bad != std::string::npos) {
    return make_error(Where{path, "", 0, 0}, "not valid UTF-8 at byte " + std::to_string(bad));
  }
  std::istringstream in(text);
  YAML::Parser parser(in);
  ShapeCheck shape;
  int documents = 0;
  try {
    while (parser.HandleNextDocument(shape)) {
      if (++documents > 1) break;
    }
  } catch (const ShapeCheck::TooDeep& e) {
    return make_error(Where{path, "", e.mark.line + 1, e.mark.column + 1},
                      "nested more than " + std::to_string(limits::kMaxNestingDepth) +
                          " sequences or maps deep");
  } catch (const YAML::Exception& e) {
    return make_error(Where{path, "", e.mark.line + 1, e.mark.column + 1}, "malformed YAML: " + e.msg);
  }
  if (documents > 1) {
    return make_error(Where{path, "", shape.last_document.line + 1, shape.last_document.column + 1},
                      "more than one YAML document ('---' starts a second one); a file holds exactly one");
  }
  return Status::Ok();
}

// Parses `text` as one YAML document and returns parse(reader, root), with
// `path` and the SHA-256 of `text` recorded in the result. Every yaml-cpp
// exception becomes an error naming the file, line and column; `what` names
// the kind of document in those messages ("model", "cluster").
template <class T, class Parse>
Result<T> parse_yaml_document(const std::string& text, const std::string& path, const char* what, Parse parse) {
  const Reader r{path};
  SPINDLE_TRY(check_yaml_shape(text, path));
  try {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::ParserException& e) {
      return make_error(Where{path, "", e.mark.line + 1, e.mark.column + 1}, "malformed YAML: " + e.msg);
    }
    Result<T> result = parse(r, root);
    if (!result.ok()) return result;
    result->path = path;
    result->sha256 = sha256_hex(text);
    return result;
  } catch (const YAML::Exception& e) {
    return make_error(Where{path, "", e.mark.line + 1, e.mark.column + 1},
                      std::string("cannot read the ") + what + ": " + e.msg);
  } catch (const std::exception& e) {
    return make_error(Where{path, "", 0, 0}, std::string("cannot read the ") + what + ": " + e.what());
  }
}

}  // namespace spindle::plan::yamlu
