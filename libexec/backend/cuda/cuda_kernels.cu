// Kernels of the CUDA backend (declared in cuda_kernels.h). Simple on
// purpose: elementwise kernels with grid-stride loops, one warp per row for
// row reductions (LayerNorm, softmax, losses), atomics for column sums and
// scatters. Arithmetic in fp32 throughout; kernels that the transformer
// layer's bf16 mode uses are templates over the storage type (float or
// bf16: load converts to fp32, store rounds once). The matrix products are
// cuBLAS's.
#include "libexec/backend/cuda/cuda_kernels.h"

#include "libexec/backend/cuda/cuda_check.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace spindle::exec::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp;  // warp-per-row kernels
constexpr float kLayerNormEps = 1e-5f;           // libexec/ops/kernels.h
constexpr float kGeluC = 0.7978845608028654f;
constexpr float kGeluA = 0.044715f;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

// Blocks for ROW_STRIDE kernels: one per row, at most 65535 * 16.
unsigned grid_rows(int64_t rows) {
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > 65535 * 16 ? 65535 * 16 : rows));
}

// A dimension that row-wise kernels index in 32 bits (sequence, heads, head
// width: all far below 2^31); aborts otherwise.
int small(int64_t v) {
  if (v < 0 || v > INT32_MAX) {
    std::fprintf(stderr, "spindle: CUDA kernel dimension %lld out of range\n", static_cast<long long>(v));
    std::abort();
  }
  return static_cast<int>(v);
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// Storage conversions: every kernel computes in fp32.
__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ float ld(bf16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T st(float v);
template <>
__device__ __forceinline__ float st<float>(float v) { return v; }
template <>
__device__ __forceinline__ bf16 st<bf16>(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ float gelu(float v) {
  return 0.5f * v * (1.0f + tanhf(kGeluC * (v + kGeluA * v * v * v)));
}

__device__ __forceinline__ float gelu_grad(float v) {
  const float t = tanhf(kGeluC * (v + kGeluA * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * v * v);
}

__device__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Row handled by this warp, or -1.
__device__ int64_t warp_row(int64_t rows) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  return r < rows ? r : -1;
}

__device__ bool valid_id(float v, int64_t limit) {
  const auto id = static_cast<int64_t>(v);
  return v >= 0.0f && id < limit && static_cast<float>(id) == v;
}

// Row-wise kernels over [rows, cols]: blocks stride over rows, threads over
// columns, so no element index is divided (64-bit division costs tens of
// instructions per element).
#define ROW_STRIDE(r, rows) \
  for (int64_t r = blockIdx.x; r < (rows); r += gridDim.x)
#define COL_STRIDE(c, cols) for (int64_t c = threadIdx.x; c < (cols); c += blockDim.x)

#define GRID_STRIDE(i, n)                                                          \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void fill_k(float* x, int64_t n, float value) {
  GRID_STRIDE(i, n) x[i] = value;
}

__global__ void add_k(float* y, const float* x, int64_t n) {
  GRID_STRIDE(i, n) y[i] += x[i];
}

__global__ void convert_k(const float* x, bf16* y, int64_t n) {
  GRID_STRIDE(i, n) y[i] = st<bf16>(x[i]);
}

__global__ void add_bias_residual_k(float* y, const float* b, const float* x, int64_t rows, int64_t cols) {
  ROW_STRIDE(r, rows) COL_STRIDE(c, cols) y[r * cols + c] = (y[r * cols + c] + b[c]) + x[r * cols + c];
}

__global__ void add_bias_rows_k(float* y, const float* b, int64_t rows, int64_t cols) {
  ROW_STRIDE(r, rows) COL_STRIDE(c, cols) y[r * cols + c] += b[c];
}

__global__ void add_pos_rows_k(float* y, const float* pos, int64_t rows, int64_t seq, int64_t width) {
  ROW_STRIDE(r, rows) {
    const float* pr = pos + (r % seq) * width;
    COL_STRIDE(c, width) y[r * width + c] += pr[c];
  }
}

// Column sums in a fixed order, so that they are bitwise the same on every
// run and every rank (parameters replicated over a TP group get their
// gradients from these sums and must stay identical; atomics would add the
// blocks' shares in a timing-dependent order). Pass 1, block (32, 8):
// column c = blockIdx.x * 32 + threadIdx.x, rows strided over blockIdx.y and
// threadIdx.y, reduced in shared memory in a fixed order, one partial per
// column and blockIdx.y into part [gridDim.y, cols]. Pass 2 adds a column's
// partials in order into out.
template <typename T>
__global__ void col_partials_k(float* part, const T* a, int64_t rows, int64_t cols) {
  __shared__ float acc_s[8][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (c < cols) {
    for (int64_t r = static_cast<int64_t>(blockIdx.y) * 8 + threadIdx.y; r < rows;
         r += static_cast<int64_t>(gridDim.y) * 8) {
      acc += ld(a[r * cols + c]);
    }
  }
  acc_s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float s = 0.0f;
    for (int j = 0; j < 8; ++j) s += acc_s[j][threadIdx.x];
    part[static_cast<int64_t>(blockIdx.y) * cols + c] = s;
  }
}

__global__ void col_finish_k(float* out, const float* part, int64_t parts, int64_t cols) {
  GRID_STRIDE(c, cols) {
    float s = 0.0f;
    for (int64_t j = 0; j < parts; ++j) s += part[j * cols + c];
    out[c] += s;
  }
}

template <typename TY>
__global__ void layernorm_forward_k(const float* x, const float* g, const float* b, TY* y, float* mean_out,
                                    float* rstd, int64_t rows, int64_t w) {
  const int64_t r = warp_row(rows);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  const float* xr = x + r * w;
  float s = 0.0f;
  for (int64_t c = lane; c < w; c += kWarp) s += xr[c];
  const float mean = warp_sum(s) / static_cast<float>(w);
  float q = 0.0f;
  for (int64_t c = lane; c < w; c += kWarp) {
    const float d = xr[c] - mean;
    q += d * d;
  }
  const float rs = rsqrtf(warp_sum(q) / static_cast<float>(w) + kLayerNormEps);
  if (lane == 0) {
    rstd[r] = rs;
    mean_out[r] = mean;
  }
  for (int64_t c = lane; c < w; c += kWarp) {
    const float h = (xr[c] - mean) * rs;
    y[r * w + c] = st<TY>(h * g[c] + b[c]);
  }
}

// xhat recomputed from x, mean and rstd exactly as layernorm_forward_k
// computed it.
__global__ void layernorm_backward_k(const float* dy, const float* g, const float* x, const float* mean,
                                     const float* rstd, const float* residual, float* dx, int64_t rows, int64_t w) {
  const int64_t r = warp_row(rows);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  const float rs = rstd[r];
  const float mu = mean[r];
  const auto xh = [&](int64_t i) { return (x[i] - mu) * rs; };
  float s1 = 0.0f, s2 = 0.0f;
  for (int64_t c = lane; c < w; c += kWarp) {
    const float d = dy[r * w + c] * g[c];
    s1 += d;
    s2 += d * xh(r * w + c);
  }
  const float m1 = warp_sum(s1) / static_cast<float>(w);
  const float m2 = warp_sum(s2) / static_cast<float>(w);
  for (int64_t c = lane; c < w; c += kWarp) {
    const float d = dy[r * w + c] * g[c];
    dx[r * w + c] = rs * (d - m1 - xh(r * w + c) * m2) + (residual ? residual[r * w + c] : 0.0f);
  }
}

// col_partials_k's layout, two sums per column: partials of dy * xhat into
// pg and of dy into pb (each [gridDim.y, cols]).
__global__ void layernorm_partials_k(const float* dy, const float* x, const float* mean, const float* rstd,
                                     float* pg, float* pb, int64_t rows, int64_t cols) {
  __shared__ float sg[8][33], sb[8][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float ag = 0.0f, ab = 0.0f;
  if (c < cols) {
    for (int64_t r = static_cast<int64_t>(blockIdx.y) * 8 + threadIdx.y; r < rows;
         r += static_cast<int64_t>(gridDim.y) * 8) {
      const float d = dy[r * cols + c];
      ag += d * ((x[r * cols + c] - mean[r]) * rstd[r]);
      ab += d;
    }
  }
  sg[threadIdx.y][threadIdx.x] = ag;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float tg = 0.0f, tb = 0.0f;
    for (int j = 0; j < 8; ++j) {
      tg += sg[j][threadIdx.x];
      tb += sb[j][threadIdx.x];
    }
    pg[static_cast<int64_t>(blockIdx.y) * cols + c] = tg;
    pb[static_cast<int64_t>(blockIdx.y) * cols + c] = tb;
  }
}

template <typename T>
__global__ void bias_gelu_k(T* h, const float* b, T* a, int64_t rows, int64_t cols) {
  ROW_STRIDE(r, rows) COL_STRIDE(c, cols) {
    const int64_t i = r * cols + c;
    const T hv = st<T>(ld(h[i]) + b[c]);
    h[i] = hv;
    a[i] = st<T>(gelu(ld(hv)));
  }
}

template <typename T>
__global__ void gelu_backward_k(const T* x, const T* dy, T* dx, int64_t n) {
  GRID_STRIDE(i, n) dx[i] = st<T>(ld(dy[i]) * gelu_grad(ld(x[i])));
}

template <typename T>
__global__ void softmax_rows_k(const T* x, T* p, int64_t rows, int64_t cols, int64_t row_ld, bool causal) {
  const int64_t r = warp_row(rows);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  const T* xr = x + r * row_ld;
  T* pr = p + r * row_ld;
  const int64_t q = r % row_ld;  // query index within its block of row_ld rows
  if (q >= cols) {               // a pad query row: zeros, its scores are not read
    for (int64_t c = lane; c < row_ld; c += kWarp) pr[c] = st<T>(0.0f);
    return;
  }
  const int64_t last = causal ? q : cols - 1;  // last unmasked column
  float mx = -INFINITY;
  for (int64_t c = lane; c <= last; c += kWarp) mx = fmaxf(mx, ld(xr[c]));
  mx = warp_max(mx);
  float s = 0.0f;
  for (int64_t c = lane; c <= last; c += kWarp) s += expf(ld(xr[c]) - mx);
  const float inv = 1.0f / warp_sum(s);
  // exp again rather than stored and read back: x is read (from cache), not
  // written. Masked and pad columns (c > last, which includes c >= cols) get 0.
  for (int64_t c = lane; c < row_ld; c += kWarp) pr[c] = st<T>(c <= last ? expf(ld(xr[c]) - mx) * inv : 0.0f);
}

template <typename T>
__global__ void softmax_backward_rows_k(const T* p, const T* dp, T* ds, int64_t rows, int64_t cols, int64_t row_ld,
                                        float scale) {
  const int64_t r = warp_row(rows);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  const T* pr = p + r * row_ld;
  const T* dpr = dp + r * row_ld;
  T* dsr = ds + r * row_ld;
  if (r % row_ld >= cols) {  // a pad query row: zeros, p and dp not read
    for (int64_t c = lane; c < row_ld; c += kWarp) dsr[c] = st<T>(0.0f);
    return;
  }
  float s = 0.0f;
  for (int64_t c = lane; c < cols; c += kWarp) s += ld(pr[c]) * ld(dpr[c]);
  const float dot = warp_sum(s);
  // Each lane reads dp[c] before it writes ds[c] (ds may alias dp); pad columns get 0.
  for (int64_t c = lane; c < row_ld; c += kWarp)
    dsr[c] = st<T>(c < cols ? scale * ld(pr[c]) * (ld(dpr[c]) - dot) : 0.0f);
}

__global__ void softmax_rows_diag_nll_k(float* x, int64_t n, float* nll) {
  const int64_t r = warp_row(n);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  float* xr = x + r * n;
  float mx = -INFINITY;
  for (int64_t c = lane; c < n; c += kWarp) mx = fmaxf(mx, xr[c]);
  mx = warp_max(mx);
  const float diag = xr[r] - mx;
  __syncwarp();
  float s = 0.0f;
  for (int64_t c = lane; c < n; c += kWarp) {
    const float e = expf(xr[c] - mx);
    xr[c] = e;
    s += e;
  }
  const float sum = warp_sum(s);
  if (lane == 0) nll[r] = logf(sum) - diag;
  const float inv = 1.0f / sum;
  for (int64_t c = lane; c < n; c += kWarp) xr[c] *= inv;
}

// Row b * seq + t of [batch, seq, heads * dh] (x of to_heads, y of
// from_heads); column c = j * dh + d goes to [b, j, t, d] of [batch, heads,
// sp, dh] (sp >= seq rows per head). to_heads strides over the batch * sp
// padded rows r = b * sp + t and writes zeros for t >= seq, so that the pad
// rows need no separate memset. Only 32-bit divisions, once per row and per
// column.
template <typename T>
__global__ void to_heads_k(const T* x, const float* bias, T* y, int64_t rows, int seq, int sp, int heads, int dh) {
  ROW_STRIDE(r, rows) {
    const int64_t b = r / sp, t = r % sp;
    const T* xr = t < seq ? x + (b * seq + t) * heads * dh : nullptr;  // null on a pad row
    for (int c = threadIdx.x; c < heads * dh; c += blockDim.x) {
      const int j = c / dh, d = c % dh;
      T v = st<T>(0.0f);
      if (xr) v = bias ? st<T>(ld(xr[c]) + bias[c]) : xr[c];
      y[((b * heads + j) * sp + t) * dh + d] = v;
    }
  }
}

template <typename T>
__global__ void from_heads_k(const T* x, T* y, int64_t rows, int seq, int sp, int heads, int dh) {
  ROW_STRIDE(r, rows) {
    const int64_t b = r / seq, t = r % seq;
    for (int c = threadIdx.x; c < heads * dh; c += blockDim.x) {
      const int j = c / dh, d = c % dh;
      y[r * heads * dh + c] = x[((b * heads + j) * sp + t) * dh + d];
    }
  }
}

__global__ void transpose_k(const float* a, float* at, int64_t rows, int64_t cols) {
  GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    at[c * rows + r] = a[i];
  }
}

__global__ void token_embed_forward_k(const float* ids, const float* table, const float* pos, float* y,
                                      int64_t rows, int64_t seq, int64_t width, int64_t vocab, int* bad) {
  ROW_STRIDE(r, rows) {
    const float v = ids[r];
    const bool ok = valid_id(v, vocab);
    if (!ok && threadIdx.x == 0) *bad = 1;
    const float* er = ok ? table + static_cast<int64_t>(v) * width : nullptr;
    const float* pr = pos + (r % seq) * width;
    COL_STRIDE(c, width) y[r * width + c] = (er ? er[c] : 0.0f) + pr[c];
  }
}

__global__ void token_embed_backward_k(const float* ids, const float* dy, float* dtable, int64_t rows,
                                       int64_t width, int64_t vocab) {
  ROW_STRIDE(r, rows) {
    const float v = ids[r];
    if (!valid_id(v, vocab)) continue;
    float* dr = dtable + static_cast<int64_t>(v) * width;
    COL_STRIDE(c, width) atomicAdd(dr + c, dy[r * width + c]);
  }
}

__global__ void mean_seq_k(const float* x, float* m, int64_t n, int64_t seq, int64_t width) {
  GRID_STRIDE(i, n) {
    const int64_t b = i / width, c = i % width;
    float s = 0.0f;
    for (int64_t t = 0; t < seq; ++t) s += x[(b * seq + t) * width + c];
    m[i] = s / static_cast<float>(seq);
  }
}

__global__ void broadcast_seq_k(const float* dm, float* dx, int64_t rows, int64_t seq, int64_t width,
                                float scale) {
  ROW_STRIDE(r, rows) {
    const float* mr = dm + (r / seq) * width;
    COL_STRIDE(c, width) dx[r * width + c] = mr[c] * scale;
  }
}

__global__ void row_max_k(const float* x, float* mx, int64_t rows, int64_t cols) {
  const int64_t r = warp_row(rows);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  float m = -INFINITY;
  for (int64_t c = lane; c < cols; c += kWarp) m = fmaxf(m, x[r * cols + c]);
  m = warp_max(m);
  if (lane == 0) mx[r] = m;
}

__global__ void lm_exp_sums_k(float* logits, const float* mx, const float* targets, float* red, int64_t rows,
                              int64_t vl, int64_t first, int64_t vocab, int* bad) {
  const int64_t r = warp_row(rows);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  float* lr = logits + r * vl;
  const float tv = targets[r];
  const bool ignored = tv == -1.0f;  // position without a target: no logit picked
  const bool ok = valid_id(tv, vocab);
  if (!ok && !ignored && lane == 0) *bad = 1;
  const int64_t t = ok ? static_cast<int64_t>(tv) - first : -1;
  const float target_logit = (t >= 0 && t < vl) ? lr[t] : 0.0f;
  __syncwarp();
  const float m = mx[r];
  float s = 0.0f;
  for (int64_t c = lane; c < vl; c += kWarp) {
    const float e = expf(lr[c] - m);
    lr[c] = e;
    s += e;
  }
  s = warp_sum(s);
  if (lane == 0) {
    red[r] = s;
    red[rows + r] = target_logit;
  }
}

__global__ void scale_rows_inv_k(float* x, const float* sums, int64_t rows, int64_t cols) {
  ROW_STRIDE(r, rows) {
    const float s = sums[r];
    COL_STRIDE(c, cols) x[r * cols + c] /= s;
  }
}

__global__ void lm_dlogits_k(const float* p, const float* targets, float* dl, int64_t rows, int64_t vl,
                             int64_t first, float scale) {
  ROW_STRIDE(r, rows) {
    const float tv = targets[r];
    const int64_t t = static_cast<int64_t>(tv) - first;
    const float s = tv == -1.0f ? 0.0f : scale;  // ignored positions get no gradient
    COL_STRIDE(c, vl) dl[r * vl + c] = s * (p[r * vl + c] - (t == c ? 1.0f : 0.0f));
  }
}

__global__ void normalise_rows_k(const float* x, float* u, float* norm, int64_t rows, int64_t d) {
  const int64_t r = warp_row(rows);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  float s = 0.0f;
  for (int64_t c = lane; c < d; c += kWarp) s += x[r * d + c] * x[r * d + c];
  const float nr = sqrtf(warp_sum(s));
  if (lane == 0) norm[r] = nr;
  for (int64_t c = lane; c < d; c += kWarp) u[r * d + c] = x[r * d + c] / nr;
}

__global__ void normalise_backward_k(const float* u, const float* norm, const float* du, float* dx, int64_t rows,
                                     int64_t d) {
  const int64_t r = warp_row(rows);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  float s = 0.0f;
  for (int64_t c = lane; c < d; c += kWarp) s += u[r * d + c] * du[r * d + c];
  const float dot = warp_sum(s);
  for (int64_t c = lane; c < d; c += kWarp) dx[r * d + c] = (du[r * d + c] - u[r * d + c] * dot) / norm[r];
}

__global__ void contrastive_dlogits_k(const float* pr, const float* pct, float* dl, int64_t n, float coef) {
  GRID_STRIDE(i, n * n) {
    const int64_t r = i / n, c = i % n;
    dl[i] = coef * (pr[i] + pct[c * n + r] - (r == c ? 2.0f : 0.0f));
  }
}

// One value's AdamW update (optim/adamw.h), shared by adamw_k and
// adamw_batch_k so that both update bitwise alike.
__device__ __forceinline__ void adamw_value(float& p, float grad, float& m, float& v, float lr, float beta1,
                                            float beta2, float eps, float decay, float bc1, float bc2, float gscale) {
  const float g = grad * gscale;
  const float mi = beta1 * m + (1.0f - beta1) * g;
  const float vi = beta2 * v + (1.0f - beta2) * g * g;
  m = mi;
  v = vi;
  p = p * decay - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
}

__global__ void adamw_k(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                        float beta2, float eps, float decay, float bc1, float bc2, float gscale) {
  GRID_STRIDE(i, n) adamw_value(p[i], g[i], m[i], v[i], lr, beta1, beta2, eps, decay, bc1, bc2, gscale);
}

// Value i of the batch belongs to the first tensor t with i < end[t].
__global__ void adamw_batch_k(AdamWBatch b, float lr, float beta1, float beta2, float eps, float decay,
                              float gscale) {
  GRID_STRIDE(i, b.end[b.count - 1]) {
    int lo = 0, hi = b.count - 1;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (i < b.end[mid]) hi = mid;
      else lo = mid + 1;
    }
    const int64_t j = i - (lo > 0 ? b.end[lo - 1] : 0);
    adamw_value(b.p[lo][j], b.g[lo][j], b.m[lo][j], b.v[lo][j], lr, beta1, beta2, eps, decay, b.bc1[lo], b.bc2[lo],
                gscale);
  }
}

// Block b's share of the squares of x (grid-stride), reduced in shared
// memory in a fixed order into part[b].
__global__ void sum_squares_k(double* part, const float* x, int64_t n) {
  __shared__ double acc_s[kThreads];
  double acc = 0;
  GRID_STRIDE(i, n) {
    const double v = x[i];
    acc += v * v;
  }
  acc_s[threadIdx.x] = acc;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o /= 2) {
    if (static_cast<int>(threadIdx.x) < o) acc_s[threadIdx.x] += acc_s[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[blockIdx.x] = acc_s[0];
}

}  // namespace

#define LAUNCH(kernel, grid, block, ...)      \
  do {                                        \
    kernel<<<(grid), (block)>>>(__VA_ARGS__);                                         \
    const cudaError_t spindle_launch_rc_ = cudaGetLastError();                        \
    if (spindle_launch_rc_ != cudaSuccess)                                            \
      cuda_fail("CUDA", cudaGetErrorString(spindle_launch_rc_), #kernel, __FILE__, __LINE__); \
  } while (0)

void fill(float* x, int64_t n, float value) {
  if (n > 0) LAUNCH(fill_k, blocks_for(n), kThreads, x, n, value);
}

void add_inplace(float* y, const float* x, int64_t n) {
  if (n > 0) LAUNCH(add_k, blocks_for(n), kThreads, y, x, n);
}

void convert(const float* x, bf16* y, int64_t n) {
  if (n > 0) LAUNCH(convert_k, blocks_for(n), kThreads, x, y, n);
}

void add_bias_residual(float* y, const float* b, const float* x, int64_t rows, int64_t cols) {
  if (rows * cols > 0) LAUNCH(add_bias_residual_k, grid_rows(rows), kThreads, y, b, x, rows, cols);
}

void add_bias_rows(float* y, const float* b, int64_t rows, int64_t cols) {
  if (rows * cols > 0) LAUNCH(add_bias_rows_k, grid_rows(rows), kThreads, y, b, rows, cols);
}

void add_pos_rows(float* y, const float* pos, int64_t batch, int64_t seq, int64_t width) {
  if (batch * seq * width > 0)
    LAUNCH(add_pos_rows_k, grid_rows(batch * seq), kThreads, y, pos, batch * seq, seq, width);
}

namespace {

// About 64 rows per thread; blocks (32, 8) as col_sum_k expects.
dim3 col_grid(int64_t rows, int64_t cols) {
  const int64_t gy = (rows + 8 * 64 - 1) / (8 * 64);
  return dim3(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(gy < 1 ? 1 : (gy > 1024 ? 1024 : gy)));
}

}  // namespace

// Scratch for the partial sums: stream-ordered, freed after pass 2.
float* partials(int64_t count) {
  void* p = nullptr;
  CUDA_CHECK(cudaMallocAsync(&p, static_cast<size_t>(count) * sizeof(float), 0));
  return static_cast<float*>(p);
}

void free_partials(float* p) {
  CUDA_CHECK(cudaFreeAsync(p, 0));
}

template <typename T>
void col_sum_fixed(float* out, const T* a, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid = col_grid(rows, cols);
  float* part = partials(static_cast<int64_t>(grid.y) * cols);
  LAUNCH(col_partials_k<T>, grid, dim3(32, 8), part, a, rows, cols);
  LAUNCH(col_finish_k, blocks_for(cols), kThreads, out, part, static_cast<int64_t>(grid.y), cols);
  free_partials(part);
}

void col_sum(float* out, const float* a, int64_t rows, int64_t cols) { col_sum_fixed(out, a, rows, cols); }

void col_sum(float* out, const bf16* a, int64_t rows, int64_t cols) { col_sum_fixed(out, a, rows, cols); }

void layernorm_forward(const float* x, const float* g, const float* b, float* y, float* mean, float* rstd,
                       int64_t rows, int64_t w) {
  if (rows > 0) LAUNCH(layernorm_forward_k<float>, row_blocks(rows), kThreads, x, g, b, y, mean, rstd, rows, w);
}

void layernorm_forward(const float* x, const float* g, const float* b, bf16* y, float* mean, float* rstd,
                       int64_t rows, int64_t w) {
  if (rows > 0) LAUNCH(layernorm_forward_k<bf16>, row_blocks(rows), kThreads, x, g, b, y, mean, rstd, rows, w);
}

void layernorm_backward(const float* dy, const float* g, const float* x, const float* mean, const float* rstd,
                        const float* residual, float* dx, int64_t rows, int64_t w) {
  if (rows > 0)
    LAUNCH(layernorm_backward_k, row_blocks(rows), kThreads, dy, g, x, mean, rstd, residual, dx, rows, w);
}

void layernorm_param_grads(const float* dy, const float* x, const float* mean, const float* rstd, float* dg,
                           float* db, int64_t rows, int64_t w) {
  if (rows <= 0 || w <= 0) return;
  const dim3 grid = col_grid(rows, w);
  const int64_t parts = grid.y;
  float* part = partials(2 * parts * w);
  LAUNCH(layernorm_partials_k, grid, dim3(32, 8), dy, x, mean, rstd, part, part + parts * w, rows, w);
  LAUNCH(col_finish_k, blocks_for(w), kThreads, dg, part, parts, w);
  LAUNCH(col_finish_k, blocks_for(w), kThreads, db, part + parts * w, parts, w);
  free_partials(part);
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
  if (n > 0) LAUNCH(gelu_backward_k<float>, blocks_for(n), kThreads, x, dy, dx, n);
}

void gelu_backward(const bf16* x, const bf16* dy, bf16* dx, int64_t n) {
  if (n > 0) LAUNCH(gelu_backward_k<bf16>, blocks_for(n), kThreads, x, dy, dx, n);
}

void bias_gelu(float* h, const float* b, float* a, int64_t rows, int64_t cols) {
  if (rows * cols > 0) LAUNCH(bias_gelu_k<float>, grid_rows(rows), kThreads, h, b, a, rows, cols);
}

void bias_gelu(bf16* h, const float* b, bf16* a, int64_t rows, int64_t cols) {
  if (rows * cols > 0) LAUNCH(bias_gelu_k<bf16>, grid_rows(rows), kThreads, h, b, a, rows, cols);
}

void softmax_rows(const float* x, float* p, int64_t rows, int64_t cols, int64_t ld, bool causal) {
  if (rows > 0) LAUNCH(softmax_rows_k<float>, row_blocks(rows), kThreads, x, p, rows, cols, ld, causal);
}

void softmax_rows(const bf16* x, bf16* p, int64_t rows, int64_t cols, int64_t ld, bool causal) {
  if (rows > 0) LAUNCH(softmax_rows_k<bf16>, row_blocks(rows), kThreads, x, p, rows, cols, ld, causal);
}

void softmax_backward_rows(const float* p, const float* dp, float* ds, int64_t rows, int64_t cols, int64_t ld,
                           float scale) {
  if (rows > 0) LAUNCH(softmax_backward_rows_k<float>, row_blocks(rows), kThreads, p, dp, ds, rows, cols, ld, scale);
}

void softmax_backward_rows(const bf16* p, const bf16* dp, bf16* ds, int64_t rows, int64_t cols, int64_t ld,
                           float scale) {
  if (rows > 0) LAUNCH(softmax_backward_rows_k<bf16>, row_blocks(rows), kThreads, p, dp, ds, rows, cols, ld, scale);
}

void softmax_rows_diag_nll(float* x, int64_t n, float* nll) {
  if (n > 0) LAUNCH(softmax_rows_diag_nll_k, row_blocks(n), kThreads, x, n, nll);
}

void to_heads(const float* x, const float* bias, float* y, int64_t batch, int64_t seq, int64_t sp, int64_t heads,
              int64_t dh) {
  if (batch * sp * heads * dh > 0)
    LAUNCH(to_heads_k<float>, grid_rows(batch * sp), kThreads, x, bias, y, batch * sp, small(seq), small(sp),
           small(heads), small(dh));
}

void to_heads(const bf16* x, const float* bias, bf16* y, int64_t batch, int64_t seq, int64_t sp, int64_t heads,
              int64_t dh) {
  if (batch * sp * heads * dh > 0)
    LAUNCH(to_heads_k<bf16>, grid_rows(batch * sp), kThreads, x, bias, y, batch * sp, small(seq), small(sp),
           small(heads), small(dh));
}

void from_heads(const float* x, float* y, int64_t batch, int64_t seq, int64_t sp, int64_t heads, int64_t dh) {
  if (batch * seq * heads * dh > 0)
    LAUNCH(from_heads_k<float>, grid_rows(batch * seq), kThreads, x, y, batch * seq, small(seq), small(sp),
           small(heads), small(dh));
}

void from_heads(const bf16* x, bf16* y, int64_t batch, int64_t seq, int64_t sp, int64_t heads, int64_t dh) {
  if (batch * seq * heads * dh > 0)
    LAUNCH(from_heads_k<bf16>, grid_rows(batch * seq), kThreads, x, y, batch * seq, small(seq), small(sp),
           small(heads), small(dh));
}

void transpose(const float* a, float* at, int64_t rows, int64_t cols) {
  if (rows * cols > 0) LAUNCH(transpose_k, blocks_for(rows * cols), kThreads, a, at, rows, cols);
}

void token_embed_forward(const float* ids, const float* table, const float* pos, float* y, int64_t rows,
                         int64_t seq, int64_t width, int64_t vocab, int* bad) {
  if (rows * width > 0)
    LAUNCH(token_embed_forward_k, grid_rows(rows), kThreads, ids, table, pos, y, rows, seq, width, vocab, bad);
}

void token_embed_backward(const float* ids, const float* dy, float* dtable, int64_t rows, int64_t width,
                          int64_t vocab) {
  if (rows * width > 0) LAUNCH(token_embed_backward_k, grid_rows(rows), kThreads, ids, dy, dtable, rows, width, vocab);
}

void mean_seq(const float* x, float* m, int64_t batch, int64_t seq, int64_t width) {
  const int64_t n = batch * width;
  if (n > 0) LAUNCH(mean_seq_k, blocks_for(n), kThreads, x, m, n, seq, width);
}

void broadcast_seq(const float* dm, float* dx, int64_t batch, int64_t seq, int64_t width, float scale) {
  if (batch * seq * width > 0)
    LAUNCH(broadcast_seq_k, grid_rows(batch * seq), kThreads, dm, dx, batch * seq, seq, width, scale);
}

void row_max(const float* x, float* mx, int64_t rows, int64_t cols) {
  if (rows > 0) LAUNCH(row_max_k, row_blocks(rows), kThreads, x, mx, rows, cols);
}

void lm_exp_sums(float* logits, const float* mx, const float* targets, float* red, int64_t rows, int64_t vl,
                 int64_t first, int64_t vocab, int* bad) {
  if (rows > 0)
    LAUNCH(lm_exp_sums_k, row_blocks(rows), kThreads, logits, mx, targets, red, rows, vl, first, vocab, bad);
}

void scale_rows_inv(float* x, const float* sums, int64_t rows, int64_t cols) {
  if (rows * cols > 0) LAUNCH(scale_rows_inv_k, grid_rows(rows), kThreads, x, sums, rows, cols);
}

void lm_dlogits(const float* p, const float* targets, float* dl, int64_t rows, int64_t vl, int64_t first,
                float scale) {
  if (rows * vl > 0) LAUNCH(lm_dlogits_k, grid_rows(rows), kThreads, p, targets, dl, rows, vl, first, scale);
}

void normalise_rows(const float* x, float* u, float* norm, int64_t rows, int64_t d) {
  if (rows > 0) LAUNCH(normalise_rows_k, row_blocks(rows), kThreads, x, u, norm, rows, d);
}

void normalise_backward(const float* u, const float* norm, const float* du, float* dx, int64_t rows, int64_t d) {
  if (rows > 0) LAUNCH(normalise_backward_k, row_blocks(rows), kThreads, u, norm, du, dx, rows, d);
}

void contrastive_dlogits(const float* pr, const float* pct, float* dl, int64_t n, float coef) {
  if (n > 0) LAUNCH(contrastive_dlogits_k, blocks_for(n * n), kThreads, pr, pct, dl, n, coef);
}

void adamw(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
           float decay, float bc1, float bc2, float gscale) {
  if (n > 0) LAUNCH(adamw_k, blocks_for(n), kThreads, p, g, m, v, n, lr, beta1, beta2, eps, decay, bc1, bc2, gscale);
}

int sum_squares_partials(double* part, const float* x, int64_t n) {
  if (n <= 0) return 0;
  const unsigned blocks = std::min<unsigned>(blocks_for(n), kSquareBlocks);
  LAUNCH(sum_squares_k, blocks, kThreads, part, x, n);
  return static_cast<int>(blocks);
}

void adamw_batch(const AdamWBatch& b, float lr, float beta1, float beta2, float eps, float decay, float gscale) {
  if (b.count > 0 && b.end[b.count - 1] > 0)
    LAUNCH(adamw_batch_k, blocks_for(b.end[b.count - 1]), kThreads, b, lr, beta1, beta2, eps, decay, gscale);
}

}  // namespace spindle::exec::cuda
