// spindle-profile: writes the profile database of a model on a cluster
// (spec/cli.md, spec/profile.md). Exit 0 on success, 2 on bad usage or invalid
// input, 1 on a runtime failure (e.g. the output cannot be written).
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "libplan/cost/analytic.h"
#include "libplan/graph/op_graph.h"
#include "libplan/io/profile.h"
#include "libplan/model/cluster.h"
#include "libplan/model/model.h"
#include "libplan/util/files.h"

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitInvalid = 2;

// Parses "1,2,4,8" into counts; false on anything else.
bool parse_counts(const std::string& text, std::vector<int>& out) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty() || item.size() > 9 || item.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    out.push_back(std::stoi(item));
  }
  return !out.empty();
}

std::string counts_summary(const spindle::plan::Profile& p) {
  int lo = 0, hi = 0;
  for (const auto& e : p.entries) {
    for (const auto& pt : e.points) {
      if (lo == 0 || pt.devices < lo) lo = pt.devices;
      hi = std::max(hi, pt.devices);
    }
  }
  return std::to_string(lo) + ".." + std::to_string(hi);
}

}  // namespace

int main(int argc, char** argv) {
  namespace sp = spindle::plan;
  CLI::App app{"spindle-profile: operator scaling curves of a model on a cluster (spec/profile.md)"};
  std::string model_path, cluster_path, out_path, devices_text;
  bool analytic = false, measure = false;
  app.add_option("MODEL", model_path, "model description (YAML)")->required();
  app.add_option("--cluster", cluster_path, "cluster description (YAML)")->required();
  app.add_option("-o,--output", out_path, "profile database to write (JSON)")->required();
  auto* a = app.add_flag("--analytic", analytic, "compute from the cluster's device numbers (default)");
  auto* m = app.add_flag("--measure", measure, "time the operators on the local backend");
  a->excludes(m);
  app.add_option("--devices", devices_text,
                 "comma-separated device counts to profile (default: every valid count up to the "
                 "cluster size)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitInvalid;
  }

  if (measure) {
    std::fprintf(stderr,
                 "spindle-profile: --measure needs the runtime (libexec), which this build does not "
                 "provide yet; use --analytic\n");
    return kExitInvalid;
  }
  std::vector<int> counts;
  if (!devices_text.empty() && !parse_counts(devices_text, counts)) {
    std::fprintf(stderr, "spindle-profile: --devices: expected positive integers separated by commas, found '%s'\n",
                 devices_text.c_str());
    return kExitInvalid;
  }

  auto model = sp::load_model(model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.error().message.c_str());
    return kExitInvalid;
  }
  auto cluster = sp::load_cluster(cluster_path);
  if (!cluster.ok()) {
    std::fprintf(stderr, "%s\n", cluster.error().message.c_str());
    return kExitInvalid;
  }
  const sp::OpGraph graph = sp::expand(*model);
  auto profile = sp::analytic_profile(*model, graph, *cluster, counts.empty() ? nullptr : &counts);
  if (!profile.ok()) {
    std::fprintf(stderr, "%s\n", profile.error().message.c_str());
    return kExitInvalid;
  }
  const std::string bytes = sp::profile_to_json(*profile);
  if (auto st = sp::write_file_atomic(out_path, bytes); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.error().message.c_str());
    return kExitRuntime;
  }
  std::printf("spindle-profile: %zu entries, analytic on %s, device counts %s -> %s\n",
              profile->entries.size(), profile->device.c_str(), counts_summary(*profile).c_str(),
              out_path.c_str());
  return 0;
}
