// bench/gpu: achieved TFLOP/s and share of the bf16 dense peak of every
// shipped transformer layer shape (configs/models/*.yaml: hidden, heads,
// ffn, seq of each transformer_layer operator) over local batches, forward
// plus backward on the CUDA backend with parameters, inputs and gradients in
// device memory (the data behind the scaling curves; docs/gpu.md).
//
//   gpu [--batches 1,2,4,...,256] [--precision bf16|fp32] [--peak-tflops 989]
//       [--budget-ms 150] [--hidden H] [--csv OUT.csv]
//
// Per point it also prints the forward and backward shares of the time, the
// time of the products of the layer's six weight matrices alone (per
// weight: output, input gradient and weight gradient, 18 in all; cuBLAS,
// bf16 operands with fp32 accumulation, or fp32; random operands): what the
// layer would take if everything else were free (the attention products,
// 3% of the FLOPs at ViT-H, are not in it), and the peak device memory of the point
// (the stream-ordered pool's high-water mark: parameters, input, output
// gradient, what forward keeps, the backward's temporaries).
//
// FLOPs per sample per layer, forward + backward (Megatron's count with the
// actual ffn; causal layers counted in full):
//   3 * (8 s h^2 + 4 s h ffn + 4 s^2 h)      (= 3 (24 s h^2 + 4 s^2 h) at ffn = 4h)
// Time: wall clock around forward + backward + synchronize, median of the
// repeats (at least 3, more while under --budget-ms per point) after one
// warm-up. A point whose rough memory estimate (point_bytes) exceeds 70% of
// the device's memory is skipped with a line saying so. Exits 0 with a
// message when there is no CUDA device.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

// Rough device bytes of one point (bf16 mode: 2-byte internals; fp32: 4):
// fp32 input, output, their gradients and the residual stream (8 [b, s, h]),
// the [b, s, h] and [b, s, ffn] internals kept or made in backward (about 10
// and 4), scores and probabilities with their gradients (2 [b, heads, s, s]),
// and the layer products' own buffers (about the same again as the MLP's).
double point_bytes(const LayerShape& s, int64_t batch, bool bf16) {
  const double e = bf16 ? 2 : 4, b = static_cast<double>(batch), q = static_cast<double>(s.seq);
  const double h = static_cast<double>(s.hidden), f = static_cast<double>(s.ffn), heads = static_cast<double>(s.heads);
  return b * q * (8 * 4 * h + 10 * e * h + 8 * e * f) + 2 * e * b * heads * q * q;
}

double layer_flops(const LayerShape& s, int64_t batch) {
  const double h = static_cast<double>(s.hidden), f = static_cast<double>(s.ffn), q = static_cast<double>(s.seq);
  return 3.0 * (8 * q * h * h + 4 * q * h * f + 4 * q * q * h) * static_cast<double>(batch);
}

#define CHECK_CUDA(call)                                                                     \
  do {                                                                                       \
    if ((call) != cudaSuccess) {                                                             \
      std::fprintf(stderr, "gpu: %s failed: %s\n", #call, cudaGetErrorString(cudaGetLastError())); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)
#define CHECK_CUBLAS(call)                                       \
  do {                                                           \
    if ((call) != CUBLAS_STATUS_SUCCESS) {                       \
      std::fprintf(stderr, "gpu: %s failed\n", #call);           \
      std::exit(1);                                              \
    }                                                            \
  } while (0)

// The layer's weight products alone, forward and backward, at its shapes
// (rows n = batch * seq): per weight W [in, out]: y = x W, dx = dy W^T,
// dW = x^T dy. Operands bf16 with fp32 accumulation (bf16) or fp32 (fp32),
// outputs in the operand type. Returns milliseconds (median of `repeats`).
class GemmOnly {
 public:
  GemmOnly() { CHECK_CUBLAS(cublasCreate(&h_)); }
  ~GemmOnly() {
    cublasDestroy(h_);
    for (void* p : bufs_) cudaFree(p);
  }

  double time(const LayerShape& s, int64_t batch, bool bf16, int repeats) {
    const int64_t n = batch * s.seq, h = s.hidden, f = s.ffn;
    const std::vector<std::pair<int64_t, int64_t>> weights{{h, h}, {h, h}, {h, h}, {h, h}, {h, f}, {f, h}};
    const size_t es = bf16 ? 2 : 4;
    const int64_t wide = std::max(h, f);
    // Inputs x, dy and W random and never written; outputs into o1, o2.
    void* x = random_buffer(0, n * wide, bf16);
    void* dy = random_buffer(1, n * wide, bf16);
    void* w = random_buffer(2, wide * wide, bf16);
    void* o1 = buffer(3, static_cast<size_t>(n * wide) * es);
    void* o2 = buffer(4, static_cast<size_t>(wide * wide) * es);
    const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const float one = 1, zero = 0;
    // Row-major C [M, N] = op(A) op(B) as column-major C^T = op(B)^T op(A)^T.
    auto gemm = [&](bool ta, bool tb, int64_t M, int64_t N, int64_t K, void* A, int64_t lda, void* B, int64_t ldb,
                    void* C, int64_t ldc) {
      CHECK_CUBLAS(cublasGemmEx(h_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &one, B, t,
                                static_cast<int>(ldb), A, t, static_cast<int>(lda), &zero, C, t, static_cast<int>(ldc),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    auto once = [&]() {
      for (const auto& [in, out] : weights) {
        gemm(false, false, n, out, in, x, in, w, out, o1, out);  // y = x W
        gemm(false, true, n, in, out, dy, out, w, out, o1, in);  // dx = dy W^T
        gemm(true, false, in, out, n, x, in, dy, out, o2, out);  // dW = x^T dy
      }
    };
    once();
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<double> ms;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      once();
      CHECK_CUDA(cudaDeviceSynchronize());
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

 private:
  // Buffer i of at least `count` elements, filled with uniform values in
  // [-1, 1) (a 1 Mi-element host block, repeated) when first made that big.
  void* random_buffer(size_t i, int64_t count, bool bf16) {
    const size_t es = bf16 ? 2 : 4;
    const bool fresh = sizes_.size() <= i || sizes_[i] < static_cast<size_t>(count) * es;
    void* p = buffer(i, static_cast<size_t>(count) * es);
    if (fresh) {
      const int64_t block = int64_t{1} << 20;
      std::vector<float> f(static_cast<size_t>(block));
      for (int64_t k = 0; k < block; ++k) f[static_cast<size_t>(k)] = se::uniform_pm1(17, i, k);
      std::vector<__nv_bfloat16> b16(f.begin(), f.end());
      const void* src = bf16 ? static_cast<const void*>(b16.data()) : static_cast<const void*>(f.data());
      for (int64_t off = 0; off < count; off += block) {
        const int64_t m = std::min(block, count - off);
        CHECK_CUDA(cudaMemcpy(static_cast<char*>(p) + off * static_cast<int64_t>(es), src,
                              static_cast<size_t>(m) * es, cudaMemcpyHostToDevice));
      }
    }
    return p;
  }

  void* buffer(size_t i, size_t bytes) {
    if (bufs_.size() <= i) {
      bufs_.resize(i + 1, nullptr);
      sizes_.resize(i + 1, 0);
    }
    if (sizes_[i] < bytes) {
      if (bufs_[i]) CHECK_CUDA(cudaFree(bufs_[i]));
      CHECK_CUDA(cudaMalloc(&bufs_[i], bytes));
      sizes_[i] = bytes;
    }
    return bufs_[i];
  }
  cublasHandle_t h_ = nullptr;
  std::vector<void*> bufs_;
  std::vector<size_t> sizes_;
};

// The default pool's high-water mark in bytes since the last reset.
uint64_t pool_peak(bool reset) {
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaMemPool_t pool = nullptr;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t v = 0;
  if (reset) {
    CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &v));
    return 0;
  }
  CHECK_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &v));
  return v;
}

// A device tensor of uniform values in [-1, 1), drawn on every host core
// (the values are counter-based, so any split gives the same tensor; one
// thread took seconds per point at ViT-H's batch 256).
se::Tensor device_random(se::Backend& b, se::Shape shape, uint64_t seed) {
  se::Tensor h = se::Tensor::zeros(std::move(shape));
  float* v = h.data();
  const int64_t n = h.numel();
  const int64_t parts = std::max<int64_t>(1, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < parts; ++t)
    threads.emplace_back([=] {
      for (int64_t i = n * t / parts; i < n * (t + 1) / parts; ++i) v[i] = se::uniform_pm1(seed, 5, i);
    });
  for (std::thread& t : threads) t.join();
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
  int64_t only_hidden = 0;
  app.add_option("--batches", batches_text, "local batches, comma-separated")->capture_default_str();
  app.add_option("--precision", precision, "matmul precision: bf16 | fp32")->capture_default_str();
  app.add_option("--peak-tflops", peak_tflops, "dense bf16 peak of the device (H200: 989)")->capture_default_str();
  app.add_option("--budget-ms", budget_ms, "time budget of the repeats of one point")->capture_default_str();
  app.add_option("--models", models_dir, "folder of model YAMLs")->capture_default_str();
  app.add_option("--hidden", only_hidden, "only the shapes of this hidden size (0: all)");
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
  std::printf("%-8s %-6s %-6s %-5s %-6s %-7s %8s %9s %7s %5s %9s %7s %7s  %s\n", "hidden", "heads", "ffn", "seq",
              "causal", "batch", "ms", "TFLOP/s", "share", "fwd%", "gemm ms", "gemm%", "peak GB", "models");
  std::ofstream csv;
  if (!csv_path.empty()) {
    csv.open(csv_path);
    csv << "hidden,heads,ffn,seq,causal,batch,ms,tflops,share_of_peak,forward_ms,gemm_only_ms,peak_bytes,models\n";
  }
  double vith_best = 0;
  GemmOnly gemm_only;
  for (const LayerShape& s : shipped_shapes(models_dir)) {
    if (only_hidden > 0 && s.hidden != only_hidden) continue;
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
      const double need = point_bytes(s, b, options.matmul == se::MatmulPrecision::bf16);
      if (need > 0.7 * info.memory_gbytes * 1e9) {
        std::printf("%-8lld %-6lld %-6lld %-5lld %-6s %-7lld skipped: needs about %.0f GB of %.0f\n",
                    static_cast<long long>(s.hidden), static_cast<long long>(s.heads), static_cast<long long>(s.ffn),
                    static_cast<long long>(s.seq), s.causal ? "yes" : "no", static_cast<long long>(b), need / 1e9,
                    info.memory_gbytes);
        continue;
      }
      const se::Tensor x = device_random(*backend, {b, s.seq, s.hidden}, 7);
      const se::Tensor dy = device_random(*backend, {b, s.seq, s.hidden}, 8);
      // One forward + backward; fwd_ms gets the forward's share (synchronised).
      double fwd_ms = 0;
      auto once = [&]() {
        const auto t0 = std::chrono::steady_clock::now();
        se::Tensor y = backend->forward(op, std::span(&x, 1));
        backend->synchronize();
        fwd_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        std::vector<se::Tensor> dx = backend->backward(op, dy);
        backend->synchronize();
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      };
      once();  // warm-up (cuBLAS heuristics, pool growth)
      pool_peak(true);
      std::vector<std::pair<double, double>> ms;  // (total, forward)
      double spent = 0;
      while (ms.size() < 3 || (spent < budget_ms && ms.size() < 50)) {
        const double total = once();
        ms.push_back({total, fwd_ms});
        spent += total;
      }
      const uint64_t peak = pool_peak(false);
      std::sort(ms.begin(), ms.end());
      const auto [med, med_fwd] = ms[ms.size() / 2];
      const double gemm_ms = gemm_only.time(s, b, options.matmul == se::MatmulPrecision::bf16, 5);
      const double tflops = layer_flops(s, b) / (med * 1e-3) / 1e12;
      const double share = tflops / peak_tflops;
      if (s.hidden == 1280 && s.seq == 257) vith_best = std::max(vith_best, share);
      std::printf("%-8lld %-6lld %-6lld %-5lld %-6s %-7lld %8.2f %9.1f %6.1f%% %4.0f%% %9.2f %6.0f%% %7.2f  %s\n",
                  static_cast<long long>(s.hidden), static_cast<long long>(s.heads), static_cast<long long>(s.ffn),
                  static_cast<long long>(s.seq), s.causal ? "yes" : "no", static_cast<long long>(b), med, tflops,
                  100 * share, 100 * med_fwd / med, gemm_ms, 100 * gemm_ms / med, static_cast<double>(peak) / 1e9,
                  s.models.c_str());
      std::fflush(stdout);
      if (csv)
        csv << s.hidden << ',' << s.heads << ',' << s.ffn << ',' << s.seq << ',' << (s.causal ? 1 : 0) << ',' << b
            << ',' << med << ',' << tflops << ',' << share << ',' << med_fwd << ',' << gemm_ms << ',' << peak << ','
            << s.models << std::endl;   // flushed: a run stopped at its time box keeps every row it printed
    }
  }
  if (vith_best > 0)
    std::printf("gpu: ViT-H layer (hidden 1280, seq 257): best %.1f%% of peak (target >= 50%%): %s\n",
                100 * vith_best, vith_best >= 0.5 ? "met" : "NOT met");
  return 0;
}
