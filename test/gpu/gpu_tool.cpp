// Helper of gpu_equiv.sh (label gpu).
//
//   gpu_tool count                      prints the number of CUDA devices (0 without a driver)
//   gpu_tool losses REF.jsonl GOT.jsonl RTOL
//       every task loss of every step of two spindle-run --metrics files
//       must agree: |got - ref| <= RTOL * max(|ref|, 0.1). Prints the worst
//       relative difference; exits 0 when all agree, 1 otherwise, 2 on
//       unreadable input.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "libexec/backend/cuda/cuda_backend.h"

namespace {

bool read_losses(const std::string& path, std::vector<std::vector<double>>* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("loss") || !j["loss"].is_object()) return false;
    std::vector<double> row;  // tasks in name order
    for (const auto& [task, v] : j["loss"].items()) row.push_back(v.get<double>());
    out->push_back(row);
  }
  return !out->empty();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "count" && argc == 2) {
    std::printf("%d\n", spindle::exec::cuda_device_count());
    return 0;
  }
  if (cmd != "losses" || argc != 5) {
    std::fprintf(stderr, "usage: gpu_tool count | gpu_tool losses REF.jsonl GOT.jsonl RTOL\n");
    return 2;
  }
  std::vector<std::vector<double>> ref, got;
  if (!read_losses(argv[2], &ref) || !read_losses(argv[3], &got)) {
    std::fprintf(stderr, "gpu_tool: cannot read the losses of %s or %s\n", argv[2], argv[3]);
    return 2;
  }
  const double rtol = std::atof(argv[4]);
  if (ref.size() != got.size()) {
    std::printf("FAIL: %zu steps against %zu\n", got.size(), ref.size());
    return 1;
  }
  double worst = 0;
  bool ok = true;
  for (size_t s = 0; s < ref.size(); ++s) {
    if (ref[s].size() != got[s].size()) {
      std::printf("FAIL: step %zu: %zu tasks against %zu\n", s + 1, got[s].size(), ref[s].size());
      return 1;
    }
    for (size_t t = 0; t < ref[s].size(); ++t) {
      const double rel = std::abs(got[s][t] - ref[s][t]) / std::max(std::abs(ref[s][t]), 0.1);
      worst = std::max(worst, rel);
      if (rel > rtol) {
        ok = false;
        std::printf("FAIL: step %zu task %zu: %.7g against %.7g (relative %.3g > %.3g)\n", s + 1, t, got[s][t],
                    ref[s][t], rel, rtol);
      }
    }
  }
  std::printf("%s: %zu steps, worst relative loss difference %.3g (tolerance %.3g)\n", ok ? "PASS" : "FAIL",
              ref.size(), worst, rtol);
  return ok ? 0 : 1;
}
