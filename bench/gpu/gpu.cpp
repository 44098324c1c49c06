// bench/gpu: achieved TFLOP/s and share of the bf16 dense peak of every
// shipped transformer layer shape (configs/models/*.yaml: hidden, heads,
// ffn, seq of each transformer_layer operator) over local batches, forward
// plus backward on the CUDA backend with parameters, inputs and gradients in
// device memory (the data behind the scaling curves; docs/gpu.md).
//
//   gpu [--batches 1,2,4,...,256] [--precision bf16|fp32] [--peak-tflops 989]
//       [--budget-ms 150] [--csv OUT.csv]
//
// FLOPs per sample per layer, forward + backward (Megatron's count with the
// actual ffn; causal layers counted in full):
//   3 * (8 s h^2 + 4 s h ffn + 4 s^2 h)      (= 3 (24 s h^2 + 4 s^2 h) at ffn = 4h)
// Time: wall clock around forward + backward + synchronize, median of the
// repeats (at least 3, more while under --budget-ms per point) after one
// warm-up. Exits 0 with a message when there is no CUDA device.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>

#include "libexec/backend/cuda/cuda_backend.h"
#include "libexec/ops/op.h"
#include "libexec/rng.h"
#include "libplan/graph/op_graph.h"
#include "libplan/model/model.h"

namespace se = spindle::exec;
namespace sp = spindle::plan;

namespace {

struct LayerShape {
  int64_t hidden = 0, heads = 0, ffn = 0, seq = 0;
  bool causal = false;
  std::string models;  // which shipped models use it
  auto key() const { return std::tuple(hidden, heads, ffn, seq, causal); }
};

std::vector<LayerShape> shipped_shapes(const std::string& dir) {
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>, LayerShape> out;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    auto model = sp::load_model(f.string());
    if (!model.ok()) {
      std::fprintf(stderr, "gpu: skipping %s: %s\n", f.c_str(), model.error().message.c_str());
      continue;
    }
    for (const sp::Operator& op : sp::expand(*model).ops) {
      if (op.workload.op != "transformer_layer") continue;
      const auto& d = op.workload.dims;
      LayerShape s;
      s.hidden = d.at("hidden").get<int64_t>();
      s.heads = d.at("heads").get<int64_t>();
      s.ffn = d.at("ffn").get<int64_t>();
      s.seq = op.workload.seq;
      s.causal = d.contains("causal") && d.at("causal").get<bool>();
      LayerShape& slot = out.try_emplace(s.key(), s).first->second;
      const std::string name = f.stem().string();
      if (slot.models.find(name) == std::string::npos) slot.models += (slot.models.empty() ? "" : " ") + name;
    }
  }
  std::vector<LayerShape> v;
  for (auto& [k, s] : out) v.push_back(s);
  return v;
}

double layer_flops(const LayerShape& s, int64_t batch) {
  const double h = static_cast<double>(s.hidden), f = static_cast<double>(s.ffn), q = static_cast<double>(s.seq);
  return 3.0 * (8 * q * h * h + 4 * q * h * f + 4 * q * q * h) * static_cast<double>(batch);
}

se::Tensor device_random(se::Backend& b, se::Shape shape, uint64_t seed) {
  se::Tensor h = se::Tensor::zeros(std::move(shape));
  for (int64_t i = 0; i < h.numel(); ++i) h[i] = se::uniform_pm1(seed, 5, i);
  se::Tensor d = b.allocate(h.shape());
  b.copy(h, d);
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench/gpu: transformer-layer TFLOP/s on the CUDA backend"};
  std::string batches_text = "1,2,4,8,16,32,64,128,256", precision = "bf16", csv_path;
  std::string models_dir = std::string(SPINDLE_SOURCE_DIR) + "/configs/models";
  double peak_tflops = 989, budget_ms = 150;
  app.add_option("--batches", batches_text, "local batches, comma-separated")->capture_default_str();
  app.add_option("--precision", precision, "matmul precision: bf16 | fp32")->capture_default_str();
  app.add_option("--peak-tflops", peak_tflops, "dense bf16 peak of the device (H200: 989)")->capture_default_str();
  app.add_option("--budget-ms", budget_ms, "time budget of the repeats of one point")->capture_default_str();
  app.add_option("--models", models_dir, "folder of model YAMLs")->capture_default_str();
  app.add_option("--csv", csv_path, "also write the table as CSV");
  CLI11_PARSE(app, argc, argv);

  if (se::cuda_device_count() == 0) {
    std::printf("gpu: no CUDA device visible: nothing measured\n");
    return 0;
  }
  if (precision != "bf16" && precision != "fp32") {
    std::fprintf(stderr, "gpu: --precision %s: expected bf16 or fp32\n", precision.c_str());
    return 2;
  }
  std::vector<int64_t> batches;
  {
    std::stringstream ss(batches_text);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) batches.push_back(std::stoll(item));
  }
  se::cuda_bind_device(0);
  const se::CudaDeviceInfo info = se::cuda_device_info();
  se::CudaOptions options;
  options.matmul = precision == "fp32" ? se::MatmulPrecision::fp32 : se::MatmulPrecision::bf16;
  std::unique_ptr<se::Backend> backend = se::make_cuda_backend(options);
  std::printf("gpu: %s (%d SMs, %.0f GB), matmul %s, peak %.0f TFLOP/s (bf16 dense)\n", info.name.c_str(),
              info.sm_count, info.memory_gbytes, precision.c_str(), peak_tflops);
  std::printf("%-8s %-6s %-6s %-5s %-6s %-7s %6s %10s %9s %7s  %s\n", "hidden", "heads", "ffn", "seq", "causal",
              "batch", "ms", "TFLOP/s", "share", "", "models");
  std::ofstream csv;
  if (!csv_path.empty()) {
    csv.open(csv_path);
    csv << "hidden,heads,ffn,seq,causal,batch,ms,tflops,share_of_peak,models\n";
  }
  double vith_best = 0;
  for (const LayerShape& s : shipped_shapes(models_dir)) {
    se::OpConfig cfg;
    cfg.kind = se::OpKind::transformer_layer;
    cfg.dims = {{"hidden", s.hidden}, {"heads", s.heads}, {"ffn", s.ffn}, {"causal", s.causal}};
    se::ParamSet params = se::make_params(cfg, "bench/0.0", 1);
    for (se::Param& p : params.params) {  // parameters live on the device
      se::Tensor v = backend->allocate(p.value.shape());
      backend->copy(p.value, v);
      p.value = v;
      p.grad = backend->allocate(p.grad.shape());
    }
    se::Op op = se::make_op(cfg, params);
    for (int64_t b : batches) {
      const se::Tensor x = device_random(*backend, {b, s.seq, s.hidden}, 7);
      const se::Tensor dy = device_random(*backend, {b, s.seq, s.hidden}, 8);
      auto once = [&]() {
        const auto t0 = std::chrono::steady_clock::now();
        se::Tensor y = backend->forward(op, std::span(&x, 1));
        std::vector<se::Tensor> dx = backend->backward(op, dy);
        backend->synchronize();
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      };
      once();  // warm-up (cuBLAS heuristics, pool growth)
      std::vector<double> ms;
      double spent = 0;
      while (ms.size() < 3 || (spent < budget_ms && ms.size() < 50)) {
        ms.push_back(once());
        spent += ms.back();
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      const double tflops = layer_flops(s, b) / (med * 1e-3) / 1e12;
      const double share = tflops / peak_tflops;
      if (s.hidden == 1280 && s.seq == 257) vith_best = std::max(vith_best, share);
      std::printf("%-8lld %-6lld %-6lld %-5lld %-6s %-7lld %6.2f %10.1f %8.1f%% %7s  %s\n",
                  static_cast<long long>(s.hidden), static_cast<long long>(s.heads), static_cast<long long>(s.ffn),
                  static_cast<long long>(s.seq), s.causal ? "yes" : "no", static_cast<long long>(b), med, tflops,
                  100 * share, "", s.models.c_str());
      std::fflush(stdout);
      if (csv)
        csv << s.hidden << ',' << s.heads << ',' << s.ffn << ',' << s.seq << ',' << (s.causal ? 1 : 0) << ',' << b
            << ',' << med << ',' << tflops << ',' << share << ',' << s.models << '\n';
    }
  }
  if (vith_best > 0)
    std::printf("gpu: ViT-H layer (hidden 1280, seq 257): best %.1f%% of peak (target >= 50%%): %s\n",
                100 * vith_best, vith_best >= 0.5 ? "met" : "NOT met");
  return 0;
}
