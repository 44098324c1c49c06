// Reader and writer of the profile database (spec/profile.md).
#include "libplan/io/profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "libplan/io/json_reader.h"
#include "libplan/model/ops.h"
#include "libplan/util/files.h"
#include "libplan/util/limits.h"

namespace spindle::plan {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "spindle-profile";

// Times are written with this many significant digits (fixed float formatting:
// the same double always gives the same text, and the text read back gives
// the same double, so encode/decode/encode is byte-identical).
constexpr int kMsSignificantDigits = 6;

double round_significant(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return std::strtod(buf, nullptr);
}

const char* type_name(const json& j) {
  if (j.is_number_integer()) return "an integer";
  if (j.is_number_float()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_boolean()) return "a boolean";
  if (j.is_object()) return "an object";
  if (j.is_array()) return "an array";
  return "null";
}

bool is_extension_key(const std::string& k) { return k == "x" || k.rfind("x-", 0) == 0; }

class ProfileReader {
 public:
  explicit ProfileReader(std::string path) : path_(std::move(path)) {}

  Error err(const std::string& key, const std::string& what) const {
    return make_error(Where{path_, key, 0, 0}, what);
  }

  // Unknown keys (other than x / x-*) are errors; required keys must be present.
  Status check_keys(const json& obj, const std::string& at, const std::set<std::string>& required,
                    const std::set<std::string>& optional) const {
    for (const auto& [k, v] : obj.items()) {
      (void)v;
      if (required.count(k) || optional.count(k) || is_extension_key(k)) continue;
      return err(join(at, k), "unknown key (extensions go under `x` or `x-*`)");
    }
    for (const auto& k : required) {
      if (!obj.contains(k)) return err(join(at, k), "missing required key");
    }
    return Status::Ok();
  }

  Result<std::string> get_string(const json& obj, const std::string& at, const char* k) const {
    const json& v = obj.at(k);
    if (!v.is_string()) return err(join(at, k), std::string("expected a string, found ") + type_name(v));
    return v.get<std::string>();
  }

  // An integer in min..max (limits.h).
  Result<int64_t> get_int(const json& obj, const std::string& at, const char* k, int64_t min,
                          int64_t max) const {
    const json& v = obj.at(k);
    if (!v.is_number_integer()) {
      return err(join(at, k), std::string("expected an integer, found ") + type_name(v));
    }
    const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(max);
    const int64_t x = too_big ? max : v.get<int64_t>();
    if (too_big || x < min || x > max) {
      return err(join(at, k), "expected an integer from " + std::to_string(min) + " to " + std::to_string(max) +
                                  ", found " + v.dump());
    }
    return x;
  }

  Result<double> get_number(const json& obj, const std::string& at, const char* k) const {
    const json& v = obj.at(k);
    if (!v.is_number()) return err(join(at, k), std::string("expected a number, found ") + type_name(v));
    const double x = v.get<double>();
    if (!std::isfinite(x)) return err(join(at, k), "expected a finite number");
    return x;
  }

  static std::string join(const std::string& at, const std::string& k) {
    return at.empty() ? k : at + "." + k;
  }

 private:
  std::string path_;
};

bool valid_source(const std::string& s) { return s == "analytic" || s == "measured"; }

// "x-links" (docs/profiling.md): {"ranks": N, "intra_island"|"inter_island":
// {"p2p"|"allreduce": {"gbytes_per_s": > 0, "latency_us": >= 0}}, "progress":
// "calls"|"background"}, every part optional except ranks.
Result<ProfileLinks> parse_links(const ProfileReader& r, const json& j) {
  const std::string at = "x-links";
  if (!j.is_object()) return r.err(at, std::string("expected an object, found ") + type_name(j));
  SPINDLE_TRY(r.check_keys(j, at, {"ranks"}, {"intra_island", "inter_island", "progress"}));
  ProfileLinks l;
  auto ranks = r.get_int(j, at, "ranks", 1, limits::kMaxDevices);
  SPINDLE_TRY(ranks);
  l.ranks = int(*ranks);
  if (j.contains("progress")) {
    SPINDLE_ASSIGN(progress, r.get_string(j, at, "progress"));
    if (progress != "calls" && progress != "background")
      return r.err(at + ".progress", "expected \"calls\" or \"background\", found " + j["progress"].dump());
    l.progress_in_calls = progress == "calls";
  }
  for (const char* level : {"intra_island", "inter_island"}) {
    if (!j.contains(level)) continue;
    const std::string lat = at + "." + level;
    const json& jl = j[level];
    if (!jl.is_object()) return r.err(lat, std::string("expected an object, found ") + type_name(jl));
    SPINDLE_TRY(r.check_keys(jl, lat, {}, {"p2p", "allreduce"}));
    for (const char* kind : {"p2p", "allreduce"}) {
      if (!jl.contains(kind)) continue;
      const std::string kat = lat + "." + kind;
      const json& jk = jl[kind];
      if (!jk.is_object()) return r.err(kat, std::string("expected an object, found ") + type_name(jk));
      SPINDLE_TRY(r.check_keys(jk, kat, {"gbytes_per_s", "latency_us"}, {}));
      auto bw = r.get_number(jk, kat, "gbytes_per_s");
      SPINDLE_TRY(bw);
      if (!(*bw >= limits::kMinRate && *bw <= limits::kMaxRate)) {
        return r.err(kat + ".gbytes_per_s", "expected a bandwidth from " + json(limits::kMinRate).dump() + " to " +
                                                json(limits::kMaxRate).dump() + ", found " + jk["gbytes_per_s"].dump());
      }
      auto lat_us = r.get_number(jk, kat, "latency_us");
      SPINDLE_TRY(lat_us);
      if (!(*lat_us >= 0 && *lat_us <= limits::kMaxLatencyUs)) {
        return r.err(kat + ".latency_us", "expected a latency from 0 to " + json(limits::kMaxLatencyUs).dump() +
                                              ", found " + jk["latency_us"].dump());
      }
      const bool intra = std::string(level) == "intra_island";
      const bool p2p = std::string(kind) == "p2p";
      Link& link = intra ? (p2p ? l.intra_p2p : l.intra_allreduce) : (p2p ? l.inter_p2p : l.inter_allreduce);
      link = Link{*bw, *lat_us};
    }
  }
  return l;
}

json links_to_json(const ProfileLinks& l) {
  json j;
  j["ranks"] = l.ranks;
  if (l.progress_in_calls) j["progress"] = "calls";
  auto put = [&](const char* level, const char* kind, const Link& link) {
    if (!(link.gbytes_per_s > 0)) return;
    j[level][kind] = {{"gbytes_per_s", profile_figure(link.gbytes_per_s)},
                      {"latency_us", profile_figure(link.latency_us)}};
  };
  put("intra_island", "p2p", l.intra_p2p);
  put("intra_island", "allreduce", l.intra_allreduce);
  put("inter_island", "p2p", l.inter_p2p);
  put("inter_island", "allreduce", l.inter_allreduce);
  return j;
}

// "x-comm_overhead" ("comm_overhead" of version 3) at `at`: {"exchange_us", "message_us", "allreduce_us":
// 0 .. kMaxLatencyUs; "pack_gbytes_per_s": 0 (copies free) or a rate}, all
// required; "instruction_us" (0 .. kMaxLatencyUs) and
// "accumulate_gbytes_per_s" (0 or a rate) optional, 0 when absent;
// "reduce_scatter_us" and "allgather_us" (0 .. kMaxLatencyUs) optional,
// allreduce_us's when absent. A rate other than 0 is at least kMinRate.
Result<CommOverhead> parse_overhead(const ProfileReader& r, const json& doc, const std::string& at) {
  const json& j = doc[at];
  if (!j.is_object()) return r.err(at, std::string("expected an object, found ") + type_name(j));
  CommOverhead o;
  struct Figure {
    const char* key;
    double* into;
    bool required;
  };
  double reduce_scatter_us = 0, allgather_us = 0;   // kept only when present
  const Figure figures[] = {{"exchange_us", &o.exchange_us, true},
                            {"message_us", &o.message_us, true},
                            {"allreduce_us", &o.allreduce_us, true},
                            {"pack_gbytes_per_s", &o.pack_gbytes_per_s, true},
                            {"instruction_us", &o.instruction_us, false},
                            {"accumulate_gbytes_per_s", &o.accumulate_gbytes_per_s, false},
                            {"reduce_scatter_us", &reduce_scatter_us, false},
                            {"allgather_us", &allgather_us, false}};
  std::set<std::string> required, optional;
  for (const Figure& f : figures) (f.required ? required : optional).insert(f.key);
  SPINDLE_TRY(r.check_keys(j, at, required, optional));
  for (const Figure& f : figures) {
    const std::string k = f.key;
    if (!j.contains(k)) continue;   // optional (check_keys: the required ones are there)
    auto v = r.get_number(j, at, f.key);
    SPINDLE_TRY(v);
    // A rate is 0 (free) or a rate as everywhere else (a tiny one would
    // price a copy at ~10^300 ms); a time per call 0 .. kMaxLatencyUs.
    const bool rate = k.ends_with("_gbytes_per_s");
    const double hi = rate ? limits::kMaxRate : limits::kMaxLatencyUs;
    if (!(*v >= 0 && *v <= hi) || (rate && *v > 0 && *v < limits::kMinRate)) {
      const std::string range = rate ? "0 or a rate from " + json(limits::kMinRate).dump() + " to " + json(hi).dump()
                                     : "a number from 0 to " + json(hi).dump();
      return r.err(at + "." + k, "expected " + range + ", found " + j[k].dump());
    }
    *f.into = *v;
  }
  if (j.contains("reduce_scatter_us")) o.reduce_scatter_us = reduce_scatter_us;
  if (j.contains("allgather_us")) o.allgather_us = allgather_us;
  return o;
}

// An extension key holding one object of one number, `key`, in [min, max]
// ("x-optimizer": {"gbytes_per_s": a rate}, "x-compute": {"in_step_scale":
// a factor}; docs/profiling.md); `what` names the number in the error.
Result<double> parse_one_figure(const ProfileReader& r, const json& j, const std::string& at, const std::string& key,
                                double min, double max, const std::string& what) {
  if (!j.is_object()) return r.err(at, std::string("expected an object, found ") + type_name(j));
  SPINDLE_TRY(r.check_keys(j, at, {key}, {}));
  SPINDLE_ASSIGN(v, r.get_number(j, at, key.c_str()));
  if (!(v >= min && v <= max)) {
    return r.err(at + "." + key, "expected " + what + " from " + json(min).dump() + " to " + json(max).dump() +
                                     ", found " + j[key].dump());
  }
  return v;
}

// The optional figures only when not 0, so files without them re-encode
// to the same bytes.
json overhead_to_json(const CommOverhead& o) {
  json j = {{"exchange_us", profile_figure(o.exchange_us)},
            {"message_us", profile_figure(o.message_us)},
            {"allreduce_us", profile_figure(o.allreduce_us)},
            {"pack_gbytes_per_s", profile_figure(o.pack_gbytes_per_s)}};
  if (o.instruction_us > 0) j["instruction_us"] = profile_figure(o.instruction_us);
  if (o.accumulate_gbytes_per_s > 0) j["accumulate_gbytes_per_s"] = profile_figure(o.accumulate_gbytes_per_s);
  if (o.reduce_scatter_us) j["reduce_scatter_us"] = profile_figure(*o.reduce_scatter_us);
  if (o.allgather_us) j["allgather_us"] = profile_figure(*o.allgather_us);
  return j;
}

}  // namespace

double profile_figure(double v) { return round_significant(v, kMsSignificantDigits); }

const ProfileEntry* Profile::find(const Workload& w) const {
  const std::string key = w.key();
  for (const auto& e : entries) {
    if (e.workload.key() == key) return &e;
  }
  return nullptr;
}

namespace {

// format and version first, so a different or newer file gets the right
// hint; then the top-level keys that version allows. Returns the version.
Result<int> parse_version(const ProfileReader& r, const json& doc) {
  if (!doc.contains("format")) return r.err("format", "missing required key (expected \"spindle-profile\")");
  if (!doc["format"].is_string() || doc["format"].get<std::string>() != kFormat) {
    return r.err("format", "expected \"spindle-profile\", found " + doc["format"].dump() +
                               " (is this a profile database written by spindle-profile?)");
  }
  if (!doc.contains("version")) return r.err("version", "missing required key");
  SPINDLE_ASSIGN(any, r.get_int(doc, "", "version", 1, std::numeric_limits<int>::max()));
  if (any > kProfileNewestVersion) {
    return r.err("version", "version " + std::to_string(any) + " is newer than this spindle understands (" +
                                std::to_string(kProfileNewestVersion) +
                                "): upgrade spindle, or regenerate the profile with this version's spindle-profile");
  }
  const int version = static_cast<int>(any);
  if (version >= 3) {
    SPINDLE_TRY(r.check_keys(doc, "", {"format", "version", "device", "cluster", "source", "entries", "comm_overhead"},
                             {}));
  } else if (version == 2) {
    SPINDLE_TRY(r.check_keys(doc, "", {"format", "version", "device", "cluster", "source", "entries"}, {}));
  } else {
    SPINDLE_TRY(r.check_keys(doc, "", {"format", "version", "device", "source", "entries"}, {}));
  }
  return version;
}

// The profile's header: device, source, cluster ("x-cluster"; "cluster"
// of versions 2 and 3), overhead ("x-comm_overhead"; "comm_overhead" of
// version 3), and the other extensions, into `p`.
Status parse_header(const ProfileReader& r, const json& doc, int version, Profile& p) {
  SPINDLE_ASSIGN(device, r.get_string(doc, "", "device"));
  p.device = device;
  SPINDLE_ASSIGN(source, r.get_string(doc, "", "source"));
  p.source = source;
  if (!valid_source(p.source) && !(p.source == "mixed" && version >= 2))
    return r.err("source", "expected \"analytic\" or \"measured\", found \"" + p.source + "\"");
  if (const std::string at = version >= 2 ? "cluster" : "x-cluster"; doc.contains(at)) {
    const json& jc = doc[at];
    if (!jc.is_object()) return r.err(at, std::string("expected an object, found ") + type_name(jc));
    SPINDLE_TRY(r.check_keys(jc, at, {"name", "devices", "devices_per_island"}, {}));
    SPINDLE_ASSIGN(name, r.get_string(jc, at, "name"));
    SPINDLE_ASSIGN(devices, r.get_int(jc, at, "devices", 1, limits::kMaxDevices));
    SPINDLE_ASSIGN(dpi, r.get_int(jc, at, "devices_per_island", 1, limits::kMaxDevices));
    p.cluster = ProfileCluster{name, static_cast<int>(devices), static_cast<int>(dpi)};
  }
  if (const std::string at = version >= 3 ? "comm_overhead" : "x-comm_overhead"; doc.contains(at)) {
    SPINDLE_ASSIGN(o, parse_overhead(r, doc, at));
    p.overhead = o;
  }
  if (doc.contains("x-compute")) {
    SPINDLE_ASSIGN(scale, parse_one_figure(r, doc["x-compute"], "x-compute", "in_step_scale", kMinComputeScale,
                                           kMaxComputeScale, "a factor"));
    p.compute_scale = scale;
  }
  if (doc.contains("x-links")) {
    SPINDLE_ASSIGN(links, parse_links(r, doc["x-links"]));
    p.links = links;
  }
  if (doc.contains("x-optimizer")) {
    SPINDLE_ASSIGN(rate, parse_one_figure(r, doc["x-optimizer"], "x-optimizer", "gbytes_per_s", limits::kMinRate,
                                          limits::kMaxRate, "a rate"));
    p.optimizer_gbytes_per_s = rate;
  }
  return {};
}

// Point `pat` of an entry: {devices, ms[, x-spread]} ("spread" in
// versions 2 and 3), its count above `previous` (the entry's last point so
// far; none: nullptr).
Result<ProfilePoint> parse_point(const ProfileReader& r, const json& jp, const std::string& pat,
                                 const ProfilePoint* previous, int version) {
  if (!jp.is_object()) return r.err(pat, std::string("expected an object, found ") + type_name(jp));
  const std::string spread_key = version >= 2 ? "spread" : "x-spread";   // x- keys pass check_keys anyway
  SPINDLE_TRY(r.check_keys(jp, pat, {"devices", "ms"}, version >= 2 ? std::set<std::string>{"spread"}
                                                                    : std::set<std::string>{}));
  ProfilePoint pt;
  SPINDLE_ASSIGN(d, r.get_int(jp, pat, "devices", 1, limits::kMaxDevices));
  pt.devices = static_cast<int>(d);
  if (previous && pt.devices <= previous->devices) {
    return r.err(pat + ".devices", "device counts must be strictly increasing, found " +
                                       std::to_string(pt.devices) + " after " + std::to_string(previous->devices));
  }
  SPINDLE_ASSIGN(ms, r.get_number(jp, pat, "ms"));
  if (!(ms > 0 && ms <= limits::kMaxMs)) {
    return r.err(pat + ".ms", "expected a positive time of at most " + json(limits::kMaxMs).dump() + " ms, found " +
                                  jp["ms"].dump());
  }
  pt.ms = ms;
  if (jp.contains(spread_key)) {
    SPINDLE_ASSIGN(spread, r.get_number(jp, pat, spread_key.c_str()));
    if (!(spread >= 0 && spread <= limits::kMaxMs))
      return r.err(pat + "." + spread_key, "expected a number from 0 to 1e9");
    pt.spread = spread;
  }
  return pt;
}

// Entry `at` of a profile whose source is `file_source`, of `version`.
// Its own "source" may differ from the file's (parse_profile_string then
// requires one on every entry).
Result<ProfileEntry> parse_entry(const ProfileReader& r, const json& je, const std::string& at,
                                 const std::string& file_source, int version) {
  if (!je.is_object()) return r.err(at, std::string("expected an object, found ") + type_name(je));
  SPINDLE_TRY(r.check_keys(je, at, {"op", "dims", "seq", "batch", "points", "param_bytes", "activation_bytes_per_sample"},
                           {"source", "x-forward_share"}));
  ProfileEntry e;
  SPINDLE_ASSIGN(op, r.get_string(je, at, "op"));
  if (!find_op(op)) return r.err(at + ".op", "unknown operator \"" + op + "\"");
  e.workload.op = op;
  // Exactly the op's dimensions, flat: workload keys never recurse.
  if (const std::string problem = op_dims_problem(*find_op(e.workload.op), je["dims"]); !problem.empty())
    return r.err(at + ".dims", problem);
  e.workload.dims = je["dims"];
  SPINDLE_ASSIGN(seq, r.get_int(je, at, "seq", 1, limits::kMaxSize));
  e.workload.seq = seq;
  SPINDLE_ASSIGN(batch, r.get_int(je, at, "batch", 1, limits::kMaxSize));
  e.workload.batch = batch;
  SPINDLE_ASSIGN(param_bytes, r.get_int(je, at, "param_bytes", 0, limits::kMaxBytes));
  e.param_bytes = param_bytes;
  SPINDLE_ASSIGN(act_bytes, r.get_int(je, at, "activation_bytes_per_sample", 0, limits::kMaxBytes));
  e.activation_bytes_per_sample = act_bytes;
  if (je.contains("x-forward_share")) {
    const json& f = je["x-forward_share"];
    if (!f.is_number() || !(f.get<double>() >= 0 && f.get<double>() <= 1))
      return r.err(at + ".x-forward_share",
                   "expected a number in [0, 1] (the share of ms spent in the forward), found " + f.dump());
    e.forward_share = f.get<double>();
  }
  if (je.contains("source")) {
    SPINDLE_ASSIGN(s, r.get_string(je, at, "source"));
    if (!valid_source(s)) return r.err(at + ".source", "expected \"analytic\" or \"measured\", found \"" + s + "\"");
    e.source = s;
  } else if (file_source == "mixed") {
    return r.err(at + ".source", "missing: every entry of a \"mixed\" profile names its source");
  }
  const json& jp = je["points"];
  if (!jp.is_array() || jp.empty()) return r.err(at + ".points", "expected a non-empty array of {devices, ms}");
  for (size_t k = 0; k < jp.size(); ++k) {
    SPINDLE_ASSIGN(pt, parse_point(r, jp[k], at + ".points[" + std::to_string(k) + "]",
                                   e.points.empty() ? nullptr : &e.points.back(), version));
    e.points.push_back(pt);
  }
  return e;
}

}  // namespace

Result<Profile> parse_profile_string(const std::string& json_text, const std::string& path) {
  ProfileReader r(path);
  // Size and nesting bounded before parsing (json_reader.h).
  SPINDLE_ASSIGN(doc, parse_json_text(json_text, path));
  if (!doc.is_object()) return r.err("", std::string("expected a JSON object, found ") + type_name(doc));
  SPINDLE_ASSIGN(version, parse_version(r, doc));
  Profile p;
  p.path = path;
  p.sha256 = sha256_hex(json_text);
  SPINDLE_TRY(parse_header(r, doc, version, p));
  const json& entries = doc["entries"];
  if (!entries.is_array()) return r.err("entries", std::string("expected an array, found ") + type_name(entries));
  std::map<std::string, size_t> seen;   // workload key -> its entry
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string at = "entries[" + std::to_string(i) + "]";
    SPINDLE_ASSIGN(e, parse_entry(r, entries[i], at, p.source, version));
    const std::string key = e.workload.key();
    if (auto it = seen.find(key); it != seen.end())
      return r.err(at, "duplicate entry: same op, dims, seq and batch as entries[" + std::to_string(it->second) + "]");
    seen.emplace(key, i);
    p.entries.push_back(std::move(e));
  }
  // A file may mix sources only if each entry then names its own
  // (docs/spec/profile.md).
  const auto other = std::find_if(p.entries.begin(), p.entries.end(), [&](const ProfileEntry& e) {
    return !e.source.empty() && e.source != p.source;
  });
  const auto unnamed =
      std::find_if(p.entries.begin(), p.entries.end(), [](const ProfileEntry& e) { return e.source.empty(); });
  if (other != p.entries.end() && unnamed != p.entries.end()) {
    const auto i = std::to_string(unnamed - p.entries.begin());
    return r.err("entries[" + i + "].source",
                 "missing: entries[" + std::to_string(other - p.entries.begin()) + "] says \"" + other->source +
                     "\", unlike the file's \"" + p.source +
                     "\", and a profile that mixes sources names the source of every entry");
  }
  return p;
}

Result<Profile> load_profile(const std::string& path) {
  auto text = read_file(path);
  SPINDLE_TRY(text);
  return parse_profile_string(*text, path);
}

std::vector<std::string> profile_mismatches(const Profile& profile, const Cluster& cluster) {
  std::vector<std::string> out;
  if (profile.device != cluster.device_name) {
    out.push_back("device: the profile was made for \"" + profile.device + "\", cluster '" + cluster.name +
                  "' has \"" + cluster.device_name + "\"");
  }
  if (profile.cluster) {
    const ProfileCluster& c = *profile.cluster;
    if (c.name != cluster.name) {
      out.push_back("cluster.name: the profile was made for cluster '" + c.name + "', not '" + cluster.name + "'");
    }
    if (c.devices != cluster.devices() || c.devices_per_island != cluster.devices_per_island) {
      out.push_back("cluster.devices: the profile was made for " + std::to_string(c.devices) + " devices (" +
                    std::to_string(c.devices_per_island) + " per island), cluster '" + cluster.name + "' has " +
                    std::to_string(cluster.devices()) + " (" + std::to_string(cluster.devices_per_island) +
                    " per island)");
    }
  }
  return out;
}

std::string profile_to_json(const Profile& profile) {
  std::map<std::string, const ProfileEntry*> sorted;   // by Workload::key()
  for (const auto& e : profile.entries) sorted.emplace(e.workload.key(), &e);

  // Top-level keys in sorted order (as nlohmann sorts object keys); one entry
  // per line, compact.
  std::string out = "{\n";
  out += "  \"device\": " + json(profile.device).dump() + ",\n";
  out += "  \"entries\": [";
  bool first = true;
  for (const auto& [key, e] : sorted) {
    (void)key;
    json je;
    je["op"] = e->workload.op;
    je["dims"] = e->workload.dims;
    je["seq"] = e->workload.seq;
    je["batch"] = e->workload.batch;
    je["param_bytes"] = e->param_bytes;
    je["activation_bytes_per_sample"] = e->activation_bytes_per_sample;
    if (!e->source.empty()) je["source"] = e->source;
    if (e->forward_share >= 0) je["x-forward_share"] = profile_figure(e->forward_share);
    json pts = json::array();
    for (const auto& pt : e->points) {
      json jp;
      jp["devices"] = pt.devices;
      jp["ms"] = profile_figure(pt.ms);
      if (pt.spread > 0) jp["x-spread"] = round_significant(pt.spread, 3);
      pts.push_back(std::move(jp));
    }
    je["points"] = std::move(pts);
    out += first ? "\n    " : ",\n    ";
    out += je.dump();
    first = false;
  }
  out += first ? "],\n" : "\n  ],\n";
  out += "  \"format\": \"spindle-profile\",\n";
  out += "  \"source\": " + json(profile.source == "mixed" ? "measured" : profile.source).dump() + ",\n";
  out += "  \"version\": " + std::to_string(kProfileVersion);
  if (profile.cluster) {
    const json jc = {{"name", profile.cluster->name},
                     {"devices", profile.cluster->devices},
                     {"devices_per_island", profile.cluster->devices_per_island}};
    out += ",\n  \"x-cluster\": " + jc.dump();
  }
  if (profile.overhead) out += ",\n  \"x-comm_overhead\": " + overhead_to_json(*profile.overhead).dump();
  if (profile.compute_scale) {
    const json jc = {{"in_step_scale", profile_figure(*profile.compute_scale)}};
    out += ",\n  \"x-compute\": " + jc.dump();
  }
  if (profile.links) out += ",\n  \"x-links\": " + links_to_json(*profile.links).dump();
  if (profile.optimizer_gbytes_per_s) {
    const json jo = {{"gbytes_per_s", profile_figure(*profile.optimizer_gbytes_per_s)}};
    out += ",\n  \"x-optimizer\": " + jo.dump();
  }
  out += "\n}\n";
  return out;
}

}  // namespace spindle::plan
