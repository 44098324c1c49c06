// Parser and validator of the cluster description (spec/cluster.md).
#include "libplan/model/cluster.h"

#include <cmath>
#include <exception>

#include <yaml-cpp/yaml.h>

#include "libplan/model/yaml_util.h"
#include "libplan/util/files.h"
#include "libplan/util/limits.h"

namespace spindle::plan {

int64_t Cluster::memory_bytes() const {
  return static_cast<int64_t>(std::floor(memory_gib * 1073741824.0));
}

namespace {

using yamlu::Entry;
using yamlu::MapView;
using yamlu::Reader;

// Reads the map at `path`; every key of `required` must be present.
Status open_map(const Reader& r, const std::string& path, const YAML::Node& node,
                const std::set<std::string>& allowed, const std::vector<std::string>& required,
                const std::string& what, MapView& view) {
  if (!node.IsMap()) {
    return r.error(path, node, "expected " + what + " (a map), found " + yamlu::describe(node));
  }
  SPINDLE_TRY(r.view_map(path, node, view));
  SPINDLE_TRY(r.reject_unknown(path, view, allowed, what));
  for (const std::string& key : required) {
    if (view.find(key) == nullptr) {
      return r.error(yamlu::child(path, key), node, "missing required key '" + key + "' of " + what);
    }
  }
  return Status::Ok();
}

// A number in lo..hi at `path` (limits.h: bounds keep every derived time finite).
Status bounded(const Reader& r, const std::string& path, const YAML::Node& node, double& out, double lo,
               double hi, const char* unit) {
  SPINDLE_TRY(r.get_number(path, node, out));
  if (!(out >= lo && out <= hi)) {
    return r.error(path, node,
                   "expected " + std::string(unit) + " from " + nlohmann::json(lo).dump() + " to " +
                       nlohmann::json(hi).dump() + ", found " + node.Scalar());
  }
  return Status::Ok();
}

Status parse_link(const Reader& r, const std::string& path, const YAML::Node& node, Link& out) {
  MapView view;
  SPINDLE_TRY(open_map(r, path, node, {"gbytes_per_s", "latency_us"}, {"gbytes_per_s", "latency_us"},
                       "a link {gbytes_per_s, latency_us}", view));
  SPINDLE_TRY(bounded(r, yamlu::child(path, "gbytes_per_s"), view.find("gbytes_per_s")->value, out.gbytes_per_s,
                      limits::kMinRate, limits::kMaxRate, "a bandwidth (GB/s)"));
  // A zero latency is allowed (idealised links in tests); negative is not.
  SPINDLE_TRY(bounded(r, yamlu::child(path, "latency_us"), view.find("latency_us")->value, out.latency_us, 0,
                      limits::kMaxLatencyUs, "a latency (us)"));
  return Status::Ok();
}

Status parse_count(const Reader& r, const std::string& key, const YAML::Node& node, int& out) {
  int64_t v = 0;
  SPINDLE_TRY(r.get_int(key, node, v));
  if (v < 1 || v > limits::kMaxDevices) {
    return r.error(key, node,
                   "expected an integer from 1 to " + std::to_string(limits::kMaxDevices) + ", found " +
                       std::to_string(v) +
                       (v == 0 ? " (a cluster needs at least one device)" : ""));
  }
  out = static_cast<int>(v);
  return Status::Ok();
}

Result<Cluster> parse_cluster_yaml(const Reader& r, const YAML::Node& root) {
  Cluster c;
  MapView view;
  SPINDLE_TRY(open_map(r, "", root, {"name", "islands", "devices_per_island", "device", "links"},
                       {"name", "islands", "devices_per_island", "device", "links"},
                       "a cluster", view));
  SPINDLE_TRY(r.get_string("name", view.find("name")->value, c.name));
  if (c.name.empty()) return r.error("name", view.find("name")->value, "expected a non-empty name");
  SPINDLE_TRY(parse_count(r, "islands", view.find("islands")->value, c.islands));
  SPINDLE_TRY(parse_count(r, "devices_per_island", view.find("devices_per_island")->value,
                          c.devices_per_island));
  // devices() is an int: keep the product in range.
  if (static_cast<int64_t>(c.islands) * c.devices_per_island > limits::kMaxDevices) {
    return r.error("devices_per_island", view.find("devices_per_island")->value,
                   "islands x devices_per_island = " +
                       std::to_string(static_cast<int64_t>(c.islands) * c.devices_per_island) +
                       " devices, expected at most 1000000");
  }

  MapView dev;
  const YAML::Node& dev_node = view.find("device")->value;
  SPINDLE_TRY(open_map(r, "device", dev_node,
                       {"name", "memory_gib", "peak_tflops", "memory_gbytes_per_s"},
                       {"name", "memory_gib", "peak_tflops"}, "a device", dev));
  const Mark device_mark = yamlu::mark_of(dev_node);
  c.device_line = device_mark.line;
  c.device_column = device_mark.column;
  SPINDLE_TRY(r.get_string("device.name", dev.find("name")->value, c.device_name));
  // memory_bytes() must fit in int64_t and be at least 1 MiB.
  SPINDLE_TRY(bounded(r, "device.memory_gib", dev.find("memory_gib")->value, c.memory_gib, 1.0 / 1024, 1048576,
                      "a memory size (GiB)"));
  SPINDLE_TRY(bounded(r, "device.peak_tflops", dev.find("peak_tflops")->value, c.peak_tflops, limits::kMinRate,
                      limits::kMaxRate, "a peak (TFLOP/s)"));
  if (const Entry* e = dev.find("memory_gbytes_per_s")) {
    SPINDLE_TRY(bounded(r, "device.memory_gbytes_per_s", e->value, c.memory_gbytes_per_s, limits::kMinRate,
                        limits::kMaxRate, "a bandwidth (GB/s)"));
  }

  MapView links;
  SPINDLE_TRY(open_map(r, "links", view.find("links")->value, {"intra_island", "inter_island"},
                       {"intra_island", "inter_island"}, "links", links));
  SPINDLE_TRY(parse_link(r, "links.intra_island", links.find("intra_island")->value, c.intra_island));
  SPINDLE_TRY(parse_link(r, "links.inter_island", links.find("inter_island")->value, c.inter_island));
  return c;
}

}  // namespace

Result<Cluster> parse_cluster_string(const std::string& yaml_text, const std::string& path) {
  return yamlu::parse_yaml_document<Cluster>(yaml_text, path, "cluster", parse_cluster_yaml);
}

Result<Cluster> load_cluster(const std::string& path) {
  Result<std::string> text = read_file(path);
  if (!text.ok()) return text.error();
  return parse_cluster_string(*text, path);
}

}  // namespace spindle::plan
