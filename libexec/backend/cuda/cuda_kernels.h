// The CUDA backend's fused kernels (cuda_kernels.cu), as plain launchers:
// every pointer is device memory, row-major, fp32 unless the type says bf16
// (the transformer layer's internal storage in bf16 mode; arithmetic is
// always fp32, a bf16 result is rounded to nearest even once, when stored);
// every launch goes on the legacy default stream (the backend's only
// stream), so launches and the backend's copies and cuBLAS calls are
// ordered. Launchers return at once; a failed launch aborts the job naming
// the rank and the kernel (cuda_fail), faults surface at the next
// synchronising call. Sums that feed parameter gradients (col_sum,
// layernorm_param_grads) add in a fixed order: bitwise the same on every
// run. Formulas match the CPU reference in libexec/ops/. Compiled by nvcc
// into spindle_cuda_kernels with cuda_check.cpp; nothing else of libexec.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

namespace spindle::exec::cuda {

using bf16 = __nv_bfloat16;

// y[i] = x[i] rounded to bf16.
void convert(const float* x, bf16* y, int64_t n);

// x[i] = value.
void fill(float* x, int64_t n, float value);
// y[i] += x[i].
void add_inplace(float* y, const float* x, int64_t n);
// y[r, c] += b[c] for a [rows, cols] matrix.
void add_bias_rows(float* y, const float* b, int64_t rows, int64_t cols);
// y[r, c] = (y[r, c] + b[c]) + x[r, c]: bias and residual in one pass.
void add_bias_residual(float* y, const float* b, const float* x, int64_t rows, int64_t cols);
// y[i, t, :] += pos[t, :] for y [batch, seq, width].
void add_pos_rows(float* y, const float* pos, int64_t batch, int64_t seq, int64_t width);
// out[c] += sum_r a[r, c] for a [rows, cols] matrix (bias gradients), in a
// fixed order.
void col_sum(float* out, const float* a, int64_t rows, int64_t cols);
void col_sum(float* out, const bf16* a, int64_t rows, int64_t cols);

// LayerNorm over rows of width w, eps 1e-5: y = xhat * g + b with
// xhat = (x - mean) * rstd; writes y [rows, w], mean and rstd [rows].
void layernorm_forward(const float* x, const float* g, const float* b, float* y, float* mean, float* rstd,
                       int64_t rows, int64_t w);
void layernorm_forward(const float* x, const float* g, const float* b, bf16* y, float* mean, float* rstd,
                       int64_t rows, int64_t w);
// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) + residual,
// dxhat = dy * g, xhat recomputed as (x - mean) * rstd; residual (a residual
// branch's gradient, added in the same pass) may be null.
void layernorm_backward(const float* dy, const float* g, const float* x, const float* mean, const float* rstd,
                        const float* residual, float* dx, int64_t rows, int64_t w);
// dg[c] += sum_r dy[r, c] * (x[r, c] - mean[r]) * rstd[r]; db[c] += sum_r dy[r, c].
void layernorm_param_grads(const float* dy, const float* x, const float* mean, const float* rstd, float* dg,
                           float* db, int64_t rows, int64_t w);

// GELU (tanh approximation): dx = dy * gelu'(x) (dx may alias dy).
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n);
void gelu_backward(const bf16* x, const bf16* dy, bf16* dx, int64_t n);
// Bias and GELU of the MLP in one pass over [rows, cols]: h = h + b (stored
// in h's type), a = gelu(h) computed from the stored h.
void bias_gelu(float* h, const float* b, float* a, int64_t rows, int64_t cols);
void bias_gelu(bf16* h, const float* b, bf16* a, int64_t rows, int64_t cols);

// The attention's softmax over blocks of ld x ld (ld >= cols; units:
// elements): rows is a multiple of ld, row r starts at r * ld, its query
// index is q = r % ld, and only columns [0, cols) and query rows q < cols
// are real (the rest is padding, cuda_backend.cpp's padded_seq).
// softmax_rows: p = softmax(x) over a real row's columns [0, cols); with
// causal, column c is also masked when c > q. Masked columns and columns
// [cols, ld) are written p = 0, and pad rows (q >= cols) are written all
// zero without reading x; every element of p is written. p may alias x.
void softmax_rows(const float* x, float* p, int64_t rows, int64_t cols, int64_t ld, bool causal);
void softmax_rows(const bf16* x, bf16* p, int64_t rows, int64_t cols, int64_t ld, bool causal);
// ds = scale * p * (dp - sum_{c < cols} dp * p) over a real row's columns
// [0, cols), in the same ld x ld blocks; columns [cols, ld) and pad rows
// (r % ld >= cols, p and dp not read) are written 0; every element of ds is
// written. ds may alias dp.
void softmax_backward_rows(const float* p, const float* dp, float* ds, int64_t rows, int64_t cols, int64_t ld,
                           float scale);
void softmax_backward_rows(const bf16* p, const bf16* dp, bf16* ds, int64_t rows, int64_t cols, int64_t ld,
                           float scale);
// Row softmax in place of a square [n, n] matrix; nll[i] = -log p[i][i]
// computed as log(sum) - (x[i][i] - max).
void softmax_rows_diag_nll(float* x, int64_t n, float* nll);

// [batch, seq, heads, dh] <-> [batch, heads, sp, dh] with sp >= seq rows
// per head (units: elements; head (b, j) at (b * heads + j) * sp * dh, its
// row t at t * dh). to_heads adds bias[j * dh + d] (head j, column d) when
// bias is not null, and writes every element of y: the pad rows t in
// [seq, sp) as zeros. from_heads reads rows [0, seq) of each head and
// ignores the pad rows.
void to_heads(const float* x, const float* bias, float* y, int64_t batch, int64_t seq, int64_t sp, int64_t heads,
              int64_t dh);
void to_heads(const bf16* x, const float* bias, bf16* y, int64_t batch, int64_t seq, int64_t sp, int64_t heads,
              int64_t dh);
void from_heads(const float* x, float* y, int64_t batch, int64_t seq, int64_t sp, int64_t heads, int64_t dh);
void from_heads(const bf16* x, bf16* y, int64_t batch, int64_t seq, int64_t sp, int64_t heads, int64_t dh);
// at [cols, rows] = a [rows, cols]^T.
void transpose(const float* a, float* at, int64_t rows, int64_t cols);

// y[r, :] = table[ids[r], :] + pos[r % seq, :] for r < rows (ids: fp32
// holding integers). An id outside [0, vocab) or not an integer sets *bad = 1
// and leaves its row at pos only.
void token_embed_forward(const float* ids, const float* table, const float* pos, float* y, int64_t rows,
                         int64_t seq, int64_t width, int64_t vocab, int* bad);
// dtable[ids[r], :] += dy[r, :] (atomic; ids already checked by forward).
void token_embed_backward(const float* ids, const float* dy, float* dtable, int64_t rows, int64_t width,
                          int64_t vocab);

// m[i, c] = mean_t x[i, t, c] for x [batch, seq, width].
void mean_seq(const float* x, float* m, int64_t batch, int64_t seq, int64_t width);
// dx[i, t, c] = dm[i, c] * scale.
void broadcast_seq(const float* dm, float* dx, int64_t batch, int64_t seq, int64_t width, float scale);

// mx[r] = max_c x[r, c].
void row_max(const float* x, float* mx, int64_t rows, int64_t cols);
// lm_loss, vocab-parallel: p = exp(logits - mx[r]) in place over [rows,
// vl]; red[r] = sum of the row, red[rows + r] = logits[r, t - first] when
// the target t lies in [first, first + vl), else 0. A target outside
// [0, vocab) or not an integer sets *bad = 1, except -1 (an ignored
// position: red[rows + r] = 0).
void lm_exp_sums(float* logits, const float* mx, const float* targets, float* red, int64_t rows, int64_t vl,
                 int64_t first, int64_t vocab, int* bad);
// x[r, :] /= sums[r].
void scale_rows_inv(float* x, const float* sums, int64_t rows, int64_t cols);
// dl = scale * (p - onehot(t - first)) over local columns; 0 on rows whose
// target is -1 (ignored). dl may be p (in place: each value is read and
// written by one thread).
void lm_dlogits(const float* p, const float* targets, float* dl, int64_t rows, int64_t vl, int64_t first,
                float scale);

// u[r, :] = x[r, :] / |x[r, :]|, norm[r] = |x[r, :]|.
void normalise_rows(const float* x, float* u, float* norm, int64_t rows, int64_t d);
// dx[r, :] = (du[r, :] - u[r, :] (u[r, :] . du[r, :])) / norm[r].
void normalise_backward(const float* u, const float* norm, const float* du, float* dx, int64_t rows, int64_t d);
// dl[i, j] = coef * (pr[i, j] + pct[j, i] - 2 [i == j]) for [n, n].
void contrastive_dlogits(const float* pr, const float* pct, float* dl, int64_t n, float coef);

// AdamW (optim/adamw.h), bias corrections bc1 = 1 - beta1^t, bc2 = 1 - beta2^t
// and decay = 1 - lr * weight_decay computed by the caller; each gradient
// value multiplied by gscale first (AdamWConfig::grad_scale).
void adamw(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps,
           float decay, float bc1, float bc2, float gscale);
// The same update over up to kAdamWBatch tensors in one launch: tensor t
// holds end[t] - end[t - 1] values (end[-1] = 0, ends non-decreasing) and
// takes its own bias corrections; each value is updated exactly as adamw
// updates it. Passed by value as the kernel's argument (1.5 KB).
constexpr int kAdamWBatch = 32;
struct AdamWBatch {
  int count = 0;
  float* p[kAdamWBatch] = {};
  const float* g[kAdamWBatch] = {};
  float* m[kAdamWBatch] = {};
  float* v[kAdamWBatch] = {};
  int64_t end[kAdamWBatch] = {};
  float bc1[kAdamWBatch] = {};
  float bc2[kAdamWBatch] = {};
};
void adamw_batch(const AdamWBatch& b, float lr, float beta1, float beta2, float eps, float decay, float gscale);

// The squares of x[0, n) summed in double by at most kSquareBlocks blocks,
// each in a fixed order (no atomics), block b's sum into part[b]; returns
// the blocks used (part[0, blocks) to add, in order; 0 when n is 0).
constexpr int kSquareBlocks = 256;
int sum_squares_partials(double* part, const float* x, int64_t n);

}  // namespace spindle::exec::cuda
