#include "libexec/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "libexec/backend/cuda/cuda_check.h"
#include "libexec/backend/cuda/cuda_kernels.h"
#include "libexec/ops/kernels.h"

namespace spindle::exec {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

int cuda_bind_device(int local_rank) {
  const int n = cuda_device_count();
  if (n <= 0) cuda_fail("CUDA", "no CUDA device visible", "cuda_bind_device", __FILE__, __LINE__);
  const int device = std::max(local_rank, 0) % n;
  CUDA_CHECK(cudaSetDevice(device));
  return device;
}

CudaDeviceInfo cuda_device_info() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  CudaDeviceInfo info;
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.memory_gbytes = static_cast<double>(prop.totalGlobalMem) / 1e9;
  char bus[64] = {};
  CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, device));
  info.pci_bus_id = bus;
  return info;
}

CudaOptions cuda_options_from_env(std::string* error) {
  CudaOptions o;
  const char* v = std::getenv("SPINDLE_CUDA_MATMUL");
  const std::string s = v ? v : "";
  if (s.empty() || s == "bf16") o.matmul = MatmulPrecision::bf16;
  else if (s == "fp32") o.matmul = MatmulPrecision::fp32;
  else if (error) *error = "SPINDLE_CUDA_MATMUL=" + s + ": expected bf16 or fp32";
  return o;
}

namespace {

namespace k = spindle::exec::cuda;

// Device copies of host parameters (values and gradients) beyond this many
// bytes are dropped before the next forward (host memory is the truth for
// them, so dropping is always safe; it bounds what freed host ParamSets,
// e.g. spindle-profile's one per point, leave behind).
constexpr int64_t kMirrorLimitBytes = int64_t{4} << 30;

// A zero-filled (when `zero`) device tensor from the stream-ordered pool.
Tensor device_tensor(Shape shape, bool zero) {
  const int64_t n = shape_numel(shape);
  void* p = nullptr;
  CUDA_CHECK(cudaMallocAsync(&p, static_cast<size_t>(std::max<int64_t>(n, 1)) * kFloatBytes, 0));
  if (zero && n > 0) CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(n) * kFloatBytes, 0));
  std::shared_ptr<float[]> storage(static_cast<float*>(p), [](float* q) { (void)cudaFreeAsync(q, 0); });
  return Tensor::wrap(std::move(shape), Device::cuda, std::move(storage));
}

// Untyped device memory of an op's internals (fp32 or bf16 elements) from
// the same pool; as<T>() gives the typed pointer.
struct Buf {
  std::shared_ptr<void> mem;
  template <typename T>
  T* as() const {
    return static_cast<T*>(mem.get());
  }
};

template <typename T>
Buf device_buf(int64_t n) {
  void* p = nullptr;
  CUDA_CHECK(cudaMallocAsync(&p, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T), 0));
  return {std::shared_ptr<void>(p, [](void* q) { (void)cudaFreeAsync(q, 0); })};
}

template <typename T>
constexpr cudaDataType_t data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  else return CUDA_R_16BF;
}

Tensor upload(const Tensor& host) {
  Tensor d = device_tensor(host.shape(), false);
  if (host.numel() > 0)
    CUDA_CHECK(cudaMemcpy(d.data(), host.data(), static_cast<size_t>(host.numel()) * kFloatBytes, cudaMemcpyHostToDevice));
  return d;
}

Tensor download(const Tensor& dev) {
  Tensor h = Tensor::zeros(dev.shape());
  if (dev.numel() > 0)
    CUDA_CHECK(cudaMemcpy(h.data(), dev.data(), static_cast<size_t>(dev.numel()) * kFloatBytes, cudaMemcpyDeviceToHost));
  return h;
}

Tensor to_device(const Tensor& t) { return t.device() == Device::cuda ? t : upload(t); }

std::vector<float> download_vec(const float* d, int64_t n) {
  std::vector<float> h(static_cast<size_t>(n));
  if (n > 0) CUDA_CHECK(cudaMemcpy(h.data(), d, static_cast<size_t>(n) * kFloatBytes, cudaMemcpyDeviceToHost));
  return h;
}

void upload_vec(float* d, const std::vector<float>& h) {
  if (!h.empty()) CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * kFloatBytes, cudaMemcpyHostToDevice));
}

// The sequence length inside the attention, sp: seq rounded up to a
// multiple of 8. With an odd seq (257 for ViT-H) cuBLAS ran the batched
// attention products on align-1 kernels (19% of the ViT-H layer's kernel
// time on an H200 for 3% of its FLOPs, bench/results/gpu-h200.md); padding
// only the score matrices' leading dimension changed nothing (the aligned
// kernels also need the extents m, n, k along the contiguous axes to be
// multiples of the alignment), so the sequence itself is padded: every
// batched product has m, n, k = sp where the axis is the sequence, and its
// leading dimensions and batch strides (sp, dh, sp * sp, sp * dh) are
// multiples of 8 when dh is.
//
// Contract, per (batch, head) slice, pad index = a row or column in
// [seq, sp): Q, K, V [sp, dh] (and dO in backward) have zero pad rows
// (to_heads writes them); P [sp, sp] has zero pad rows and zero pad
// columns, and so has dS (the softmax kernels write them). A product that
// contracts over the sequence (k = sp) therefore adds, for each pad index,
// a term that is exactly 0 * 0 to every real output: O = P V (P's pad
// column times V's pad row), dV = P^T dO (P's pad row, dO's pad row),
// dQ = dS K (dS's pad column, K's pad row), dK = dS^T Q (dS's pad row, Q's
// pad row). S = scale Q K^T and dP = dO V^T contract over dh, so their
// real entries are the unpadded ones; the softmax kernels read only real
// rows' real columns of S, P and dP. Pad rows of O, dV, dQ, dK come out
// zero and from_heads ignores them. No pad value is ever non-finite (all
// are written zeros or products of zeros), so no NaN can leak in. The
// real results may still differ from an unpadded run by rounding, as
// cuBLAS picks a different kernel. Memory: the saved Q, K, V grow from
// seq to sp rows per head and the saved probabilities from seq^2 to sp^2
// per head (ViT-H: 264^2 / 257^2, +5.5%).
int64_t padded_seq(int64_t seq) { return (seq + 7) / 8 * 8; }

int as_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw std::invalid_argument(std::string("cuda backend: ") + what + " " + std::to_string(v) +
                                " does not fit a cuBLAS int");
  return static_cast<int>(v);
}

// What forward keeps for backward (device memory), per Op.
struct Saved {
  bool host_io = false;  // forward's inputs were host tensors
  int64_t b = 0, seq = 0, n = 0;
  int64_t counted = 0;  // lm_loss: tokens whose target is not -1
  Tensor x, ids, targets;                // inputs
  Tensor ln_in;                          // LayerNorm input of pool_project, lm_loss
  Tensor z, lm_probs;                    // pool_project, lm_loss
  Tensor u, w, norm_a, norm_b, pr, pct;  // contrastive_loss
  // Row means and rstd of the LayerNorms (the backward recomputes xhat from
  // the fp32 input: ln_in, or the transformer's x and x1).
  Buf mean1, rstd1, mean2, rstd2;
  // transformer_layer: internals in its storage type (fp32 or bf16), the
  // fp32 residual stream x1, and the weight matrices in the storage type
  // (bf16 copies in bf16 mode).
  Tensor x1;
  Buf xn1, qh, kh, vh, probs, attn, xn2, h1, a1;
  std::array<Buf, 6> w16;  // bf16 mode: W_Q, W_K, W_V, W_O, W_1, W_2 as used by forward
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(CudaOptions options) : options_(options) {
    CUDA_CHECK(cudaGetDevice(&device_));
    // Keep freed pool memory cached instead of returning it at every sync.
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, device_));
    uint64_t threshold = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUBLAS_CHECK(cublasSetStream(blas_, 0));
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&flag_), sizeof(int)));
  }

  ~CudaBackend() override {
    saved_.clear();
    mirrors_.clear();
    (void)cudaDeviceSynchronize();
    (void)cudaFree(flag_);
    (void)cublasDestroy(blas_);
  }

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
  Device device() const override { return Device::cuda; }

  Tensor allocate(Shape shape) override { return device_tensor(std::move(shape), true); }

  // On the compute stream, ordered after the work queued before it (the
  // last step's all-reduces included: their waits made stream 0 wait).
  void zero(Tensor& t) override {
    if (t.device() == Device::host) t.zero();
    else if (t.numel() > 0) CUDA_CHECK(cudaMemsetAsync(t.data(), 0, static_cast<size_t>(t.numel()) * kFloatBytes, 0));
  }

  void copy(const Tensor& src, Tensor& dst) override {
    if (src.numel() != dst.numel())
      throw std::invalid_argument("cuda backend: copy " + shape_str(src.shape()) + " into " + shape_str(dst.shape()));
    if (src.numel() > 0)
      CUDA_CHECK(cudaMemcpy(dst.data(), src.data(), static_cast<size_t>(src.numel()) * kFloatBytes, cudaMemcpyDefault));
  }

  // The compute stream (the legacy default stream, this backend's only
  // one), and what it was made to wait for: not the NCCL communicators'
  // own streams, whose started all-reduces go on behind it (a trace's
  // boxes, Executor::record, waited for every bucket in flight and so
  // measured a run without overlap).
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(0)); }

  // The pool's high watermark of memory in use (allocations the stream has
  // not freed yet included), at least what is in use now: a reset sets the
  // watermark to 0, which CUDA raises again at the next allocation.
  int64_t peak_bytes() override {
    uint64_t high = 0, now = 0;
    CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &high));
    CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &now));
    return static_cast<int64_t>(std::max(high, now));
  }
  void reset_peak_bytes() override {
    uint64_t zero = 0;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero));
  }

  void add(const Tensor& src, Tensor& dst) override {
    if (src.device() != Device::cuda || dst.device() != Device::cuda)
      throw std::invalid_argument("cuda backend: add of non-device memory");
    if (src.numel() != dst.numel())
      throw std::invalid_argument("cuda backend: add " + shape_str(src.shape()) + " into " + shape_str(dst.shape()));
    k::add_inplace(dst.data(), src.data(), src.numel());
  }

  Tensor forward(Op& op, std::span<const Tensor> inputs) override {
    if (static_cast<int>(inputs.size()) != op_input_count(op.kind))
      throw std::invalid_argument(std::string(op_name(op.kind)) + ": wrong number of inputs");
    if (mirror_bytes_ > kMirrorLimitBytes) {
      mirrors_.clear();
      mirror_bytes_ = 0;
    }
    Saved s;
    s.host_io = inputs[0].device() == Device::host;
    std::vector<Tensor> in;
    for (const Tensor& t : inputs) in.push_back(to_device(t));
    Tensor y;
    switch (op.kind) {
      case OpKind::patch_embed: y = patch_embed_fwd(std::get<PatchEmbedState>(op.state), in[0], s); break;
      case OpKind::token_embed: y = token_embed_fwd(std::get<TokenEmbedState>(op.state), in[0], s); break;
      case OpKind::transformer_layer:
        y = transformer_fwd(std::get<TransformerLayerState>(op.state), in[0], s);
        break;
      case OpKind::linear: y = linear_fwd(std::get<LinearState>(op.state), in[0], s); break;
      case OpKind::pool_project: y = pool_project_fwd(std::get<PoolProjectState>(op.state), in[0], s); break;
      case OpKind::contrastive_loss:
        y = contrastive_fwd(std::get<ContrastiveLossState>(op.state), in[0], in[1], s);
        break;
      case OpKind::lm_loss: y = lm_loss_fwd(std::get<LmLossState>(op.state), in[0], in[1], s); break;
    }
    const bool loss = op.kind == OpKind::contrastive_loss || op.kind == OpKind::lm_loss;
    const bool host_out = s.host_io && !loss;  // loss values are host tensors already
    saved_[&op] = std::move(s);
    return host_out ? download(y) : y;
  }

  void release_saved(Op& op) override { saved_.erase(&op); }

  std::vector<Tensor> backward(Op& op, const Tensor& grad_output) override {
    const auto it = saved_.find(&op);
    if (it == saved_.end())
      throw std::logic_error(std::string(op_name(op.kind)) + ": backward without a forward (cuda backend)");
    Saved s = std::move(it->second);
    saved_.erase(it);
    const bool loss = op.kind == OpKind::contrastive_loss || op.kind == OpKind::lm_loss;
    const bool host_out = loss ? s.host_io : grad_output.device() == Device::host;
    std::vector<Tensor> dx;
    if (loss) {
      const float g = read_scalar(grad_output);
      if (op.kind == OpKind::lm_loss) {
        dx.push_back(lm_loss_bwd(std::get<LmLossState>(op.state), g, s));
      } else {
        auto [da, db] = contrastive_bwd(std::get<ContrastiveLossState>(op.state), g, s);
        dx.push_back(std::move(da));
        dx.push_back(std::move(db));
      }
    } else {
      const Tensor dy = to_device(grad_output);
      switch (op.kind) {
        case OpKind::patch_embed: patch_embed_bwd(std::get<PatchEmbedState>(op.state), dy, s); break;
        case OpKind::token_embed: token_embed_bwd(std::get<TokenEmbedState>(op.state), dy, s); break;
        case OpKind::transformer_layer:
          dx.push_back(transformer_bwd(std::get<TransformerLayerState>(op.state), dy, s));
          break;
        case OpKind::linear: dx.push_back(linear_bwd(std::get<LinearState>(op.state), dy, s)); break;
        case OpKind::pool_project: dx.push_back(pool_project_bwd(std::get<PoolProjectState>(op.state), dy, s)); break;
        default: break;
      }
    }
    if (host_out)
      for (Tensor& t : dx) t = download(t);
    return dx;
  }

  void adamw_step(const AdamWConfig& cfg, int64_t step, Tensor& param, const Tensor& grad, Tensor& m,
                  Tensor& v) override {
    // The same scalars as the CPU update (optim/adamw.h).
    const auto [bc1, bc2, decay] = adamw_scalars(cfg, step, param, grad, m, v);
    const int64_t n = param.numel();
    const auto on_device = [](const Tensor& x) { return x.device() == Device::cuda; };
    if (on_device(param) && on_device(grad) && on_device(m) && on_device(v)) {
      k::adamw(param.data(), grad.data(), m.data(), v.data(), n, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, decay, bc1,
               bc2, cfg.grad_scale);
      return;
    }
    if (on_device(param) || on_device(grad) || on_device(m) || on_device(v))
      throw std::invalid_argument("adamw_step: parameter, gradient and moments must all be host or all device");
    Tensor dp = upload(param), dg = upload(grad), dm = upload(m), dv = upload(v);
    k::adamw(dp.data(), dg.data(), dm.data(), dv.data(), n, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, decay, bc1, bc2,
             cfg.grad_scale);
    for (auto [dst, src] : {std::pair<Tensor*, Tensor*>{&param, &dp}, {&m, &dm}, {&v, &dv}})
      CUDA_CHECK(cudaMemcpy(dst->data(), src->data(), static_cast<size_t>(n) * kFloatBytes, cudaMemcpyDeviceToHost));
  }

  // Device tensors in launches of up to kAdamWBatch tensors; host ones (and
  // a mix, which adamw_step refuses) one by one through adamw_step.
  void adamw_steps(const AdamWConfig& cfg, std::span<const AdamWUpdate> updates) override {
    k::AdamWBatch batch;
    float decay = 1.0f;
    const auto flush = [&] {
      k::adamw_batch(batch, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, decay, cfg.grad_scale);
      batch = k::AdamWBatch{};
    };
    for (const AdamWUpdate& u : updates) {
      const bool device = u.param->device() == Device::cuda && u.grad->device() == Device::cuda &&
                          u.m->device() == Device::cuda && u.v->device() == Device::cuda;
      if (!device) {
        adamw_step(cfg, u.step, *u.param, *u.grad, *u.m, *u.v);
        continue;
      }
      const AdamWScalars sc = adamw_scalars(cfg, u.step, *u.param, *u.grad, *u.m, *u.v);
      decay = sc.decay;   // the same for every update (cfg's)
      const int t = batch.count++;
      batch.p[t] = u.param->data();
      batch.g[t] = u.grad->data();
      batch.m[t] = u.m->data();
      batch.v[t] = u.v->data();
      batch.end[t] = (t > 0 ? batch.end[t - 1] : 0) + u.param->numel();
      batch.bc1[t] = sc.bc1;
      batch.bc2[t] = sc.bc2;
      if (batch.count == k::kAdamWBatch) flush();
    }
    if (batch.count > 0) flush();
  }

  // Device tensors: each tensor's squares summed on the device into at most
  // kSquareBlocks partials (fixed order), all copied back at once and added
  // here in order; host tensors on the host. The same sum on every call.
  double sum_squares(std::span<const Tensor> tensors) override {
    const Buf part = device_buf<double>(static_cast<int64_t>(tensors.size()) * k::kSquareBlocks);
    std::vector<int> blocks(tensors.size(), 0);
    for (size_t t = 0; t < tensors.size(); ++t)
      if (tensors[t].device() == Device::cuda)
        blocks[t] = k::sum_squares_partials(part.as<double>() + t * k::kSquareBlocks, tensors[t].data(),
                                            tensors[t].numel());
    std::vector<double> host(tensors.size() * k::kSquareBlocks, 0.0);
    if (!host.empty())
      CUDA_CHECK(cudaMemcpy(host.data(), part.as<double>(), host.size() * sizeof(double), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (tensors[t].device() != Device::cuda) {
        sum += Backend::sum_squares(tensors.subspan(t, 1));
        continue;
      }
      for (int b = 0; b < blocks[t]; ++b) sum += host[t * k::kSquareBlocks + static_cast<size_t>(b)];
    }
    return sum;
  }

 private:
  // ---- matrix products (row-major; see gemm) ----

  template <typename T>
  cublasComputeType_t compute(bool exact) const {
    if constexpr (!std::is_same_v<T, float>) return CUBLAS_COMPUTE_32F;
    return exact || options_.matmul == MatmulPrecision::fp32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_16BF;
  }

  // Row-major C [M, N] = alpha * op(A) op(B) + beta * C, op(A) [M, K],
  // op(B) [K, N]; lda/ldb/ldc are row strides of the stored matrices (A is
  // stored [K, M] when ta). cuBLAS is column-major: it computes C^T = op(B)^T op(A)^T.
  // Element types float or bf16 (cuda_kernels.h); fp32 operands use compute(exact),
  // bf16 operands the tensor cores with fp32 accumulation (CUBLAS_COMPUTE_32F).
  template <typename TA, typename TB, typename TC>
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const TA* A, int64_t lda, const TB* B,
            int64_t ldb, float beta, TC* C, int64_t ldc, bool exact = false) {
    if (M == 0 || N == 0) return;
    CUBLAS_CHECK(cublasGemmEx(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                              as_int(N, "N"), as_int(M, "M"), as_int(K, "K"), &alpha, B, data_type<TB>(),
                              as_int(ldb, "ldb"), A, data_type<TA>(), as_int(lda, "lda"), &beta, C, data_type<TC>(),
                              as_int(ldc, "ldc"), compute<TA>(exact), CUBLAS_GEMM_DEFAULT));
  }

  // `batch` independent gemms, matrix i at A + i * sa, B + i * sb, C + i * sc.
  template <typename TA, typename TB, typename TC>
  void gemm_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const TA* A, int64_t lda,
                    int64_t sa, const TB* B, int64_t ldb, int64_t sb, float beta, TC* C, int64_t ldc, int64_t sc,
                    int64_t batch) {
    if (M == 0 || N == 0 || batch == 0) return;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(N, "N"), as_int(M, "M"),
        as_int(K, "K"), &alpha, B, data_type<TB>(), as_int(ldb, "ldb"), sb, A, data_type<TA>(), as_int(lda, "lda"),
        sa, &beta, C, data_type<TC>(), as_int(ldc, "ldc"), sc, as_int(batch, "batch"), compute<TA>(false),
        CUBLAS_GEMM_DEFAULT));
  }

  // y [rows, out] = x [rows, in] W [in, out] (+ b).
  Tensor linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out, const float* b, Shape shape) {
    Tensor y = device_tensor(std::move(shape), false);
    gemm(false, false, rows, out, in, 1.0f, x, in, w, out, 0.0f, y.data(), out);
    if (b) k::add_bias_rows(y.data(), b, rows, out);
    return y;
  }

  // dW += x^T dy; db += column sums of dy (when db); returns dx = dy W^T
  // (empty when !want_dx).
  Tensor linear_backward(const Tensor& x, int64_t rows, int64_t in, const float* w, int64_t out, const float* dy,
                         float* dw, float* db, bool want_dx) {
    gemm(true, false, in, out, rows, 1.0f, x.data(), in, dy, out, 1.0f, dw, out);
    if (db) k::col_sum(db, dy, rows, out);
    if (!want_dx) return {};
    Tensor dx = device_tensor(x.shape(), false);
    gemm(false, true, rows, in, out, 1.0f, dy, out, w, out, 0.0f, dx.data(), in);
    return dx;
  }

  // LayerNorm over rows of the fp32 `x` into an fp32 y; the row means and
  // rstd go to `mean`, `rstd` for layernorm_backward.
  Tensor layernorm(const Tensor& x, const float* g, const float* b, Buf& mean, Buf& rstd) {
    const int64_t w = x.shape().back(), rows = x.numel() / w;
    Tensor y = device_tensor(x.shape(), false);
    mean = device_buf<float>(rows);
    rstd = device_buf<float>(rows);
    k::layernorm_forward(x.data(), g, b, y.data(), mean.as<float>(), rstd.as<float>(), rows, w);
    return y;
  }

  // LayerNorm backward with xhat recomputed from the fp32 input x and the
  // saved row mean and rstd: dx = (gradient through the LayerNorm) +
  // residual (when not empty), dg += sums of dy * xhat, db += sums of dy.
  void layernorm_backward(const Tensor& dy, const float* gain, const Tensor& x, const Buf& mean, const Buf& rstd,
                          const Tensor& residual, Tensor& dx, float* dg, float* db) {
    const int64_t w = dy.shape().back(), rows = dy.numel() / w;
    k::layernorm_param_grads(dy.data(), x.data(), mean.as<float>(), rstd.as<float>(), dg, db, rows, w);
    k::layernorm_backward(dy.data(), gain, x.data(), mean.as<float>(), rstd.as<float>(), residual.data(), dx.data(),
                          rows, w);
  }

  // ---- parameters: device tensors in place, host tensors mirrored ----

  float* mirror(const Tensor& host) {
    Tensor& m = mirrors_[host.data()];
    if (m.empty() || m.numel() != host.numel()) {
      mirror_bytes_ += (host.numel() - m.numel()) * static_cast<int64_t>(kFloatBytes);
      m = device_tensor(host.shape(), false);
    }
    return m.data();
  }

  // Device pointers of the parameters' values; host values are uploaded
  // when `upload` (forward) or when never seen before.
  std::vector<const float*> values(ParamSet& set, bool upload_host) {
    std::vector<const float*> out;
    for (Param& p : set.params) {
      if (p.value.device() == Device::cuda) {
        out.push_back(p.value.data());
        continue;
      }
      const bool fresh = !mirrors_.count(p.value.data());
      float* d = mirror(p.value);
      if (upload_host || fresh)
        CUDA_CHECK(cudaMemcpy(d, p.value.data(), static_cast<size_t>(p.value.numel()) * kFloatBytes, cudaMemcpyHostToDevice));
      out.push_back(d);
    }
    return out;
  }

  // Device pointers of the parameters' gradients; host gradients are
  // uploaded into their mirror (download_grads writes them back).
  std::vector<float*> grads(ParamSet& set) {
    std::vector<float*> out;
    for (Param& p : set.params) {
      if (p.grad.device() == Device::cuda) {
        out.push_back(p.grad.data());
        continue;
      }
      float* d = mirror(p.grad);
      CUDA_CHECK(cudaMemcpy(d, p.grad.data(), static_cast<size_t>(p.grad.numel()) * kFloatBytes, cudaMemcpyHostToDevice));
      out.push_back(d);
    }
    return out;
  }

  void download_grads(ParamSet& set, const std::vector<float*>& g) {
    for (size_t i = 0; i < set.params.size(); ++i) {
      Param& p = set.params[i];
      if (p.grad.device() == Device::host)
        CUDA_CHECK(cudaMemcpy(p.grad.data(), g[i], static_cast<size_t>(p.grad.numel()) * kFloatBytes, cudaMemcpyDeviceToHost));
    }
  }

  float read_scalar(const Tensor& t) {
    if (t.numel() != 1)
      throw std::invalid_argument("loss gradient: expected a [1] tensor, got " + shape_str(t.shape()));
    if (t.device() == Device::host) return t[0];
    float v = 0;
    CUDA_CHECK(cudaMemcpy(&v, t.data(), kFloatBytes, cudaMemcpyDeviceToHost));
    return v;
  }

  void clear_flag() { CUDA_CHECK(cudaMemsetAsync(flag_, 0, sizeof(int), 0)); }
  bool flag_set() {
    int v = 0;
    CUDA_CHECK(cudaMemcpy(&v, flag_, sizeof(int), cudaMemcpyDeviceToHost));
    return v != 0;
  }

  // Sum over the TP group, in place on device memory: directly when the
  // group's communicator carries device memory (NCCL), else staged through
  // host memory.
  void tp_reduce(const OpConfig& cfg, float* d, int64_t n) {
    if (!cfg.tp || cfg.tp->size() < 2) return;
    if (cfg.tp->device_memory()) {
      cfg.tp->all_reduce_sum_device(d, n);
      return;
    }
    std::vector<float> h = download_vec(d, n);
    cfg.tp->all_reduce_sum(h);
    upload_vec(d, h);
  }

  // ---- operators (see libexec/ops/*.h for the contracts) ----

  Tensor linear_fwd(LinearState& st, const Tensor& x, Saved& s) {
    auto p = values(*st.params, true);
    const int64_t in = st.params->params[0].value.size(0), out = st.params->params[0].value.size(1);
    if (x.shape().back() != in)
      throw std::invalid_argument("linear: input " + shape_str(x.shape()) + " vs weight [" + std::to_string(in) +
                                  ", " + std::to_string(out) + "]");
    s.x = x;
    return linear(x.data(), x.numel() / in, in, p[0], out, p[1], with_last(x.shape(), out));
  }

  Tensor linear_bwd(LinearState& st, const Tensor& dy, Saved& s) {
    auto p = values(*st.params, false);
    auto g = grads(*st.params);
    const int64_t in = st.params->params[0].value.size(0), out = st.params->params[0].value.size(1);
    Tensor dx = linear_backward(s.x, s.x.numel() / in, in, p[0], out, dy.data(), g[0], g[1], true);
    download_grads(*st.params, g);
    return dx;
  }

  Tensor patch_embed_fwd(PatchEmbedState& st, const Tensor& x, Saved& s) {
    auto p = values(*st.params, true);
    const Tensor& pos = st.params->params[2].value;
    const int64_t b = x.size(0), seq = x.size(1), in = x.size(2), h = pos.size(1);
    if (seq > pos.size(0)) throw std::invalid_argument("patch_embed: seq beyond the position table");
    if (in != st.params->params[0].value.size(0)) throw std::invalid_argument("patch_embed: input width mismatch");
    s.x = x;
    Tensor y = linear(x.data(), b * seq, in, p[0], h, p[1], {b, seq, h});
    k::add_pos_rows(y.data(), p[2], b, seq, h);
    return y;
  }

  void patch_embed_bwd(PatchEmbedState& st, const Tensor& dy, Saved& s) {
    auto p = values(*st.params, false);
    auto g = grads(*st.params);
    const int64_t b = dy.size(0), seq = dy.size(1), h = dy.size(2), in = s.x.size(2);
    linear_backward(s.x, b * seq, in, p[0], h, dy.data(), g[0], g[1], false);
    k::col_sum(g[2], dy.data(), b, seq * h);  // pos rows [0, seq)
    download_grads(*st.params, g);
  }

  Tensor token_embed_fwd(TokenEmbedState& st, const Tensor& ids, Saved& s) {
    auto p = values(*st.params, true);
    const Tensor& table = st.params->params[0].value;
    const Tensor& pos = st.params->params[1].value;
    const int64_t b = ids.size(0), seq = ids.size(1), v = table.size(0), h = table.size(1);
    if (seq > pos.size(0)) throw std::invalid_argument("token_embed: seq beyond the position table");
    s.ids = ids;
    Tensor y = device_tensor({b, seq, h}, false);
    clear_flag();
    k::token_embed_forward(ids.data(), p[0], p[1], y.data(), b * seq, seq, h, v, flag_);
    if (flag_set()) throw std::out_of_range("token_embed: an id outside the vocabulary");
    return y;
  }

  void token_embed_bwd(TokenEmbedState& st, const Tensor& dy, Saved& s) {
    auto g = grads(*st.params);
    const int64_t b = s.ids.size(0), seq = s.ids.size(1);
    const int64_t v = st.params->params[0].value.size(0), h = st.params->params[0].value.size(1);
    k::token_embed_backward(s.ids.data(), dy.data(), g[0], b * seq, h, v);
    k::col_sum(g[1], dy.data(), b, seq * h);
    download_grads(*st.params, g);
  }

  Tensor pool_project_fwd(PoolProjectState& st, const Tensor& x, Saved& s) {
    auto p = values(*st.params, true);
    const int64_t b = x.size(0), seq = x.size(1), in = x.size(2), out = st.params->params[2].value.size(1);
    s.b = b;
    s.seq = seq;
    Tensor m = device_tensor({b, 1, in}, false);
    k::mean_seq(x.data(), m.data(), b, seq, in);
    s.z = layernorm(m, p[0], p[1], s.mean1, s.rstd1);
    s.ln_in = m;
    return linear(s.z.data(), b, in, p[2], out, p[3], {b, 1, out});
  }

  Tensor pool_project_bwd(PoolProjectState& st, const Tensor& dy, Saved& s) {
    auto p = values(*st.params, false);
    auto g = grads(*st.params);
    const int64_t b = s.b, in = s.z.size(2), out = st.params->params[2].value.size(1);
    Tensor dz = linear_backward(s.z, b, in, p[2], out, dy.data(), g[2], g[3], true);
    Tensor dm = device_tensor(dz.shape(), false);
    layernorm_backward(dz, p[0], s.ln_in, s.mean1, s.rstd1, Tensor(), dm, g[0], g[1]);
    Tensor dx = device_tensor({b, s.seq, in}, false);
    k::broadcast_seq(dm.data(), dx.data(), b, s.seq, in, 1.0f / static_cast<float>(s.seq));
    download_grads(*st.params, g);
    return dx;
  }

  // Positions in the transformer layer's ParamSet (transformer_layer.cpp).
  enum : size_t { LN1_G, LN1_B, W_Q, B_Q, W_K, B_K, W_V, B_V, W_O, B_O, LN2_G, LN2_B, W_1, B_1, W_2, B_2 };

  // The layer in storage type T: fp32 (MatmulPrecision::fp32), or bf16 for
  // everything inside the layer (its weight copies, the LayerNorm outputs,
  // q/k/v, the attention scores and probabilities, the attention and MLP
  // activations, and their gradients). Its input, output, the residual
  // stream x1 between the two halves and every reduction stay fp32 (kernels
  // compute in fp32 and round once when they store), and so do the
  // parameters and their gradients. LayerNorm backward recomputes xhat from
  // the fp32 input and the saved row mean and rstd.
  Tensor transformer_fwd(TransformerLayerState& st, const Tensor& x, Saved& s) {
    return options_.matmul == MatmulPrecision::bf16 ? transformer_fwd_t<k::bf16>(st, x, s)
                                                    : transformer_fwd_t<float>(st, x, s);
  }
  Tensor transformer_bwd(TransformerLayerState& st, const Tensor& dy, Saved& s) {
    return options_.matmul == MatmulPrecision::bf16 ? transformer_bwd_t<k::bf16>(st, dy, s)
                                                    : transformer_bwd_t<float>(st, dy, s);
  }

  // An fp32 device array in storage type T: the array itself (not owned:
  // valid while `x` is), or a bf16 copy.
  template <typename T>
  Buf as_storage(const float* x, int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
      return {std::shared_ptr<void>(const_cast<float*>(x), [](void*) {})};
    } else {
      Buf b = device_buf<T>(n);
      k::convert(x, b.as<T>(), n);
      return b;
    }
  }

  // The layer's weight matrices W_Q, W_K, W_V, W_O, W_1, W_2 in T, from the
  // parameter pointers `p` (values()).
  template <typename T>
  std::array<Buf, 6> weights(const std::vector<const float*>& p, int64_t h, int64_t hl, int64_t fl) {
    return {as_storage<T>(p[W_Q], h * hl), as_storage<T>(p[W_K], h * hl), as_storage<T>(p[W_V], h * hl),
            as_storage<T>(p[W_O], hl * h),  as_storage<T>(p[W_1], h * fl), as_storage<T>(p[W_2], fl * h)};
  }

  template <typename T>
  Tensor transformer_fwd_t(TransformerLayerState& st, const Tensor& x, Saved& s) {
    auto p = values(*st.params, true);
    const int64_t b = x.size(0), seq = x.size(1), h = st.hidden, n = b * seq;
    if (x.size(2) != h) throw std::invalid_argument("transformer_layer: input " + shape_str(x.shape()));
    const int64_t lheads = st.heads / st.cfg.tp_size, dh = h / st.heads, hl = lheads * dh;
    const int64_t fl = st.ffn / st.cfg.tp_size, bh = b * lheads;
    // Per head [sp, dh] and [sp, sp], zero pad rows (padded_seq); nh: a per-head buffer.
    const int64_t sp = padded_seq(seq), sd = sp * dh, ss = sp * sp, nh = b * sp * hl;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    s.b = b;
    s.seq = seq;
    s.n = n;
    s.x = x;
    const std::array<Buf, 6> w = weights<T>(p, h, hl, fl);
    if constexpr (!std::is_same_v<T, float>) s.w16 = w;  // fp32: backward takes the parameters afresh
    const T *wq = w[0].as<T>(), *wk = w[1].as<T>(), *wv = w[2].as<T>(), *wo = w[3].as<T>(), *w1 = w[4].as<T>(),
            *w2 = w[5].as<T>();

    // Attention over this rank's heads, [b, lheads, sp, dh] layout.
    s.mean1 = device_buf<float>(n);
    s.rstd1 = device_buf<float>(n);
    s.xn1 = device_buf<T>(n * h);
    k::layernorm_forward(x.data(), p[LN1_G], p[LN1_B], s.xn1.as<T>(), s.mean1.as<float>(), s.rstd1.as<float>(), n,
                         h);
    Buf t = device_buf<T>(n * hl);
    const std::tuple<const T*, size_t, Buf*> qkv[3] = {{wq, B_Q, &s.qh}, {wk, B_K, &s.kh}, {wv, B_V, &s.vh}};
    for (const auto& [wi, bias, out] : qkv) {
      gemm(false, false, n, hl, h, 1.0f, s.xn1.as<T>(), h, wi, hl, 0.0f, t.as<T>(), hl);
      *out = device_buf<T>(nh);
      k::to_heads(t.as<T>(), p[bias], out->template as<T>(), b, seq, sp, lheads, dh);
    }
    t = {};
    // Scores, then the probabilities in place (both in T, softmax in fp32
    // inside, as Megatron's fused softmax does).
    s.probs = device_buf<T>(bh * ss);
    gemm_batched(false, true, sp, sp, dh, scale, s.qh.as<T>(), dh, sd, s.kh.as<T>(), dh, sd, 0.0f,
                 s.probs.as<T>(), sp, ss, bh);
    k::softmax_rows(s.probs.as<T>(), s.probs.as<T>(), bh * sp, seq, sp, st.causal);
    Buf oh = device_buf<T>(nh);
    gemm_batched(false, false, sp, dh, sp, 1.0f, s.probs.as<T>(), sp, ss, s.vh.as<T>(), dh, sd, 0.0f,
                 oh.as<T>(), dh, sd, bh);
    s.attn = device_buf<T>(n * hl);
    k::from_heads(oh.as<T>(), s.attn.as<T>(), b, seq, sp, lheads, dh);
    oh = {};
    s.x1 = device_tensor({b, seq, h}, false);
    gemm(false, false, n, h, hl, 1.0f, s.attn.as<T>(), hl, wo, h, 0.0f, s.x1.data(), h);  // partial under TP
    tp_reduce(st.cfg, s.x1.data(), s.x1.numel());
    k::add_bias_residual(s.x1.data(), p[B_O], x.data(), n, h);

    // MLP over this rank's ffn columns.
    s.mean2 = device_buf<float>(n);
    s.rstd2 = device_buf<float>(n);
    s.xn2 = device_buf<T>(n * h);
    k::layernorm_forward(s.x1.data(), p[LN2_G], p[LN2_B], s.xn2.as<T>(), s.mean2.as<float>(), s.rstd2.as<float>(),
                         n, h);
    s.h1 = device_buf<T>(n * fl);
    gemm(false, false, n, fl, h, 1.0f, s.xn2.as<T>(), h, w1, fl, 0.0f, s.h1.as<T>(), fl);
    s.a1 = device_buf<T>(n * fl);
    k::bias_gelu(s.h1.as<T>(), p[B_1], s.a1.as<T>(), n, fl);
    Tensor y = device_tensor({b, seq, h}, false);
    gemm(false, false, n, h, fl, 1.0f, s.a1.as<T>(), fl, w2, h, 0.0f, y.data(), h);  // partial under TP
    tp_reduce(st.cfg, y.data(), y.numel());
    k::add_bias_residual(y.data(), p[B_2], s.x1.data(), n, h);
    return y;
  }

  template <typename T>
  Tensor transformer_bwd_t(TransformerLayerState& st, const Tensor& dy, Saved& s) {
    auto p = values(*st.params, false);
    auto g = grads(*st.params);
    const int64_t b = s.b, seq = s.seq, h = st.hidden, n = s.n;
    const int64_t lheads = st.heads / st.cfg.tp_size, dh = h / st.heads, hl = lheads * dh;
    const int64_t fl = st.ffn / st.cfg.tp_size, bh = b * lheads;
    const int64_t sp = padded_seq(seq), sd = sp * dh, ss = sp * sp, nh = b * sp * hl;  // as forward
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    std::array<Buf, 6> w;
    if constexpr (std::is_same_v<T, float>) w = weights<T>(p, h, hl, fl);
    else w = std::move(s.w16);

    // MLP: dW2 += a1^T dy, db2 += sums of dy, dh1 = (dy W2^T) gelu'(h1),
    // dW1 += xn2^T dh1, db1 += sums of dh1, dxn2 = dh1 W1^T.
    Buf dyt = as_storage<T>(dy.data(), dy.numel());
    gemm(true, false, fl, h, n, 1.0f, s.a1.as<T>(), fl, dyt.as<T>(), h, 1.0f, g[W_2], h);
    k::col_sum(g[B_2], dy.data(), n, h);
    Buf dh1 = device_buf<T>(n * fl);
    gemm(false, true, n, fl, h, 1.0f, dyt.as<T>(), h, w[5].as<T>(), h, 0.0f, dh1.as<T>(), fl);
    dyt = {};
    k::gelu_backward(s.h1.as<T>(), dh1.as<T>(), dh1.as<T>(), n * fl);
    gemm(true, false, h, fl, n, 1.0f, s.xn2.as<T>(), h, dh1.as<T>(), fl, 1.0f, g[W_1], fl);
    k::col_sum(g[B_1], dh1.as<T>(), n, fl);
    Tensor dxn2 = device_tensor({b, seq, h}, false);
    gemm(false, true, n, h, fl, 1.0f, dh1.as<T>(), fl, w[4].as<T>(), fl, 0.0f, dxn2.data(), h);
    dh1 = {};
    tp_reduce(st.cfg, dxn2.data(), dxn2.numel());
    Tensor dx1 = device_tensor({b, seq, h}, false);
    layernorm_backward(dxn2, p[LN2_G], s.x1, s.mean2, s.rstd2, dy, dx1, g[LN2_G], g[LN2_B]);
    dxn2 = {};

    // Attention: dWo += attn^T dx1, dbo += sums of dx1, then back through
    // the heads to dq, dk, dv.
    Buf dx1t = as_storage<T>(dx1.data(), dx1.numel());
    gemm(true, false, hl, h, n, 1.0f, s.attn.as<T>(), hl, dx1t.as<T>(), h, 1.0f, g[W_O], h);
    k::col_sum(g[B_O], dx1.data(), n, h);
    Buf dattn = device_buf<T>(n * hl);
    gemm(false, true, n, hl, h, 1.0f, dx1t.as<T>(), h, w[3].as<T>(), h, 0.0f, dattn.as<T>(), hl);
    dx1t = {};
    Buf doh = device_buf<T>(nh);
    k::to_heads(dattn.as<T>(), nullptr, doh.as<T>(), b, seq, sp, lheads, dh);
    dattn = {};
    Buf dvh = device_buf<T>(nh);
    gemm_batched(true, false, sp, dh, sp, 1.0f, s.probs.as<T>(), sp, ss, doh.as<T>(), dh, sd, 0.0f, dvh.as<T>(),
                 dh, sd, bh);
    Buf ds = device_buf<T>(bh * ss);  // dP, then dS in place
    gemm_batched(false, true, sp, sp, dh, 1.0f, doh.as<T>(), dh, sd, s.vh.as<T>(), dh, sd, 0.0f, ds.as<T>(), sp,
                 ss, bh);
    doh = {};
    k::softmax_backward_rows(s.probs.as<T>(), ds.as<T>(), ds.as<T>(), bh * sp, seq, sp, scale);
    Buf dqh = device_buf<T>(nh), dkh = device_buf<T>(nh);
    gemm_batched(false, false, sp, dh, sp, 1.0f, ds.as<T>(), sp, ss, s.kh.as<T>(), dh, sd, 0.0f, dqh.as<T>(), dh,
                 sd, bh);
    gemm_batched(true, false, sp, dh, sp, 1.0f, ds.as<T>(), sp, ss, s.qh.as<T>(), dh, sd, 0.0f, dkh.as<T>(), dh,
                 sd, bh);
    ds = {};
    Buf dq = device_buf<T>(n * hl), dk = device_buf<T>(n * hl), dv = device_buf<T>(n * hl);
    k::from_heads(dqh.as<T>(), dq.as<T>(), b, seq, sp, lheads, dh);
    k::from_heads(dkh.as<T>(), dk.as<T>(), b, seq, sp, lheads, dh);
    k::from_heads(dvh.as<T>(), dv.as<T>(), b, seq, sp, lheads, dh);
    dqh = dkh = dvh = {};
    // dW_i += xn1^T d_i and dxn1 = sum_i d_i W_i^T over q, k, v; b_q and b_v
    // get column sums, b_k's gradient stays 0, as on the CPU
    // (transformer_layer.cpp explains why).
    Tensor dxn1 = device_tensor({b, seq, h}, false);
    const std::tuple<const Buf*, int, size_t, float*> parts[3] = {
        {&dq, 0, W_Q, g[B_Q]}, {&dk, 1, W_K, nullptr}, {&dv, 2, W_V, g[B_V]}};
    for (const auto& [d, wi, gi, db] : parts) {
      gemm(true, false, h, hl, n, 1.0f, s.xn1.as<T>(), h, d->template as<T>(), hl, 1.0f, g[gi], hl);
      if (db) k::col_sum(db, d->template as<T>(), n, hl);
      const T* wt = w[static_cast<size_t>(wi)].template as<T>();
      gemm(false, true, n, h, hl, 1.0f, d->template as<T>(), hl, wt, hl, wi == 0 ? 0.0f : 1.0f, dxn1.data(), h);
    }
    tp_reduce(st.cfg, dxn1.data(), dxn1.numel());
    Tensor dx = device_tensor({b, seq, h}, false);
    layernorm_backward(dxn1, p[LN1_G], s.x, s.mean1, s.rstd1, dx1, dx, g[LN1_G], g[LN1_B]);
    download_grads(*st.params, g);
    return dx;
  }

  Tensor lm_loss_fwd(LmLossState& st, const Tensor& x, const Tensor& targets, Saved& s) {
    auto p = values(*st.params, true);
    const int64_t h = x.shape().back(), n = x.numel() / h, kk = st.cfg.tp_size;
    const int64_t vl = st.vocab / kk, first = st.cfg.tp_rank * vl;
    if (targets.numel() != n) throw std::invalid_argument("lm_loss: one target per token expected");
    s.n = n;
    s.targets = targets;
    s.z = layernorm(x, p[0], p[1], s.mean1, s.rstd1);
    s.ln_in = x;
    s.lm_probs = linear(s.z.data(), n, h, p[2], vl, nullptr, {n, vl});  // logits, then probabilities

    // Row maxima over the whole vocabulary: the maximum over every rank's
    // segment of the gather (this rank's own among them), so that every
    // rank shifts its exponentials by the same value.
    Tensor mx = device_tensor({n}, false);
    k::row_max(s.lm_probs.data(), mx.data(), n, vl);
    std::vector<float> mxh = download_vec(mx.data(), n);
    if (kk > 1) {
      std::vector<float> all(static_cast<size_t>(n * kk));
      st.cfg.tp->all_gather(mxh, all);
      for (int64_t r = 0; r < kk; ++r)
        for (size_t i = 0; i < mxh.size(); ++i) mxh[i] = std::max(mxh[i], all[static_cast<size_t>(r * n) + i]);
      upload_vec(mx.data(), mxh);
    }
    // Sums of exponentials [0, n) and target logits [n, 2n), summed over the group.
    Tensor red = device_tensor({2 * n}, false);
    clear_flag();
    k::lm_exp_sums(s.lm_probs.data(), mx.data(), targets.data(), red.data(), n, vl, first, st.vocab, flag_);
    if (flag_set()) throw std::out_of_range("lm_loss: a target outside the vocabulary");
    tp_reduce(st.cfg, red.data(), 2 * n);
    const std::vector<float> redh = download_vec(red.data(), 2 * n);
    const std::vector<float> th = download_vec(targets.data(), n);
    k::scale_rows_inv(s.lm_probs.data(), red.data(), n, vl);
    double loss = 0;
    s.counted = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (th[static_cast<size_t>(i)] == -1.0f) continue;  // ignored position
      loss += std::log(static_cast<double>(redh[static_cast<size_t>(i)])) + mxh[static_cast<size_t>(i)] -
              redh[static_cast<size_t>(n + i)];
      ++s.counted;
    }
    return Tensor::from({1}, {s.counted > 0 ? static_cast<float>(loss / static_cast<double>(s.counted)) : 0.0f});
  }

  Tensor lm_loss_bwd(LmLossState& st, float g_loss, Saved& s) {
    auto p = values(*st.params, false);
    auto g = grads(*st.params);
    const int64_t n = s.n, vl = s.lm_probs.size(1), h = s.z.shape().back(), first = st.cfg.tp_rank * vl;
    // dL/dlogits in the probabilities' buffer (each value from its own, one
    // thread a value): backward is their last reader, so no second
    // [n, vocab/K] tensor (memory_as_run counts one).
    Tensor dl = std::move(s.lm_probs);
    s.lm_probs = {};
    k::lm_dlogits(dl.data(), s.targets.data(), dl.data(), n, vl, first,
                  s.counted > 0 ? g_loss / static_cast<float>(s.counted) : 0.0f);
    Tensor dz = linear_backward(s.z, n, h, p[2], vl, dl.data(), g[2], nullptr, true);
    dl = {};
    tp_reduce(st.cfg, dz.data(), dz.numel());
    Tensor dx = device_tensor(dz.shape(), false);
    layernorm_backward(dz, p[0], s.ln_in, s.mean1, s.rstd1, Tensor(), dx, g[0], g[1]);
    download_grads(*st.params, g);
    return dx;
  }

  Tensor contrastive_fwd(ContrastiveLossState& st, const Tensor& a, const Tensor& b, Saved& s) {
    const int64_t bsz = a.size(0);
    if (b.size(0) != bsz || a.numel() != b.numel())
      throw std::invalid_argument("contrastive_loss: inputs " + shape_str(a.shape()) + " and " +
                                  shape_str(b.shape()) + " differ");
    const int64_t d = a.numel() / bsz;
    s.n = bsz;
    s.u = device_tensor({bsz, d}, false);
    s.w = device_tensor({bsz, d}, false);
    s.norm_a = device_tensor({bsz}, false);
    s.norm_b = device_tensor({bsz}, false);
    k::normalise_rows(a.data(), s.u.data(), s.norm_a.data(), bsz, d);
    k::normalise_rows(b.data(), s.w.data(), s.norm_b.data(), bsz, d);
    // Exact fp32: the 1/temperature scale magnifies bf16 rounding.
    s.pr = device_tensor({bsz, bsz}, false);
    gemm(false, true, bsz, bsz, d, 1.0f / st.temperature, s.u.data(), d, s.w.data(), d, 0.0f, s.pr.data(), bsz, true);
    s.pct = device_tensor({bsz, bsz}, false);
    k::transpose(s.pr.data(), s.pct.data(), bsz, bsz);
    Tensor nll = device_tensor({2, bsz}, false);
    k::softmax_rows_diag_nll(s.pr.data(), bsz, nll.data());
    k::softmax_rows_diag_nll(s.pct.data(), bsz, nll.data() + bsz);
    const std::vector<float> nh = download_vec(nll.data(), 2 * bsz);
    double rows = 0, cols = 0;
    for (int64_t i = 0; i < bsz; ++i) {
      rows += nh[static_cast<size_t>(i)];
      cols += nh[static_cast<size_t>(bsz + i)];
    }
    return Tensor::from({1}, {static_cast<float>(0.5 * (rows + cols) / static_cast<double>(bsz))});
  }

  std::pair<Tensor, Tensor> contrastive_bwd(ContrastiveLossState& st, float g_loss, Saved& s) {
    const int64_t bsz = s.n, d = s.u.size(1);
    const float coef = g_loss * 0.5f / static_cast<float>(bsz) / st.temperature;
    Tensor dl = device_tensor({bsz, bsz}, false);
    k::contrastive_dlogits(s.pr.data(), s.pct.data(), dl.data(), bsz, coef);
    Tensor du = device_tensor({bsz, d}, false), dw = device_tensor({bsz, d}, false);
    gemm(false, false, bsz, d, bsz, 1.0f, dl.data(), bsz, s.w.data(), d, 0.0f, du.data(), d, true);
    gemm(true, false, bsz, d, bsz, 1.0f, dl.data(), bsz, s.u.data(), d, 0.0f, dw.data(), d, true);
    Tensor da = device_tensor({bsz, 1, d}, false), db = device_tensor({bsz, 1, d}, false);
    k::normalise_backward(s.u.data(), s.norm_a.data(), du.data(), da.data(), bsz, d);
    k::normalise_backward(s.w.data(), s.norm_b.data(), dw.data(), db.data(), bsz, d);
    return {std::move(da), std::move(db)};
  }

  CudaOptions options_;
  int device_ = 0;
  cudaMemPool_t pool_ = nullptr;   // the device's default pool, which device_tensor and Buf allocate from
  cublasHandle_t blas_ = nullptr;
  int* flag_ = nullptr;  // device int: a bad id or target seen by a kernel
  std::unordered_map<const Op*, Saved> saved_;
  std::unordered_map<const float*, Tensor> mirrors_;  // host parameter memory -> its device copy
  int64_t mirror_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(CudaOptions options) { return std::make_unique<CudaBackend>(options); }

}  // namespace spindle::exec
