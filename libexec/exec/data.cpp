#include "libexec/exec/data.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "libexec/rng.h"
#include "libplan/util/parallel.h"

namespace spindle::exec {

namespace {
using Latent = std::array<float, kLatentDim>;

Latent latent(const SampleRange& s, int64_t row) {
  const uint64_t stream = hash_name("data/latent/" + s.task);
  Latent z{};
  for (int l = 0; l < kLatentDim; ++l)
    z[static_cast<size_t>(l)] = normal01(s.seed, stream, (s.first_sample + row) * kLatentDim + l);
  return z;
}

// Rows [0, count) of the fixed projection `stream`: row i is the
// kLatentDim values normal01(seed, stream, i * kLatentDim + l). They do not
// depend on the sample, so a read draws them once for all its rows (they
// were most of its time when drawn per row: kLatentDim normals per value).
std::vector<float> projection(uint64_t seed, uint64_t stream, int64_t count, int threads) {
  std::vector<float> rows(static_cast<size_t>(count * kLatentDim));
  plan::parallel_ranges(static_cast<int64_t>(rows.size()), threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) rows[static_cast<size_t>(i)] = normal01(seed, stream, i);
  });
  return rows;
}

// Projection row `index` (of projection(...)) applied to z, about N(0, 1).
float project(const std::vector<float>& rows, int64_t index, const Latent& z) {
  const float* row = rows.data() + index * kLatentDim;
  float u = 0;
  for (int l = 0; l < kLatentDim; ++l) u += row[l] * z[static_cast<size_t>(l)];
  return u / std::sqrt(static_cast<float>(kLatentDim));
}

// N(0,1) value -> id in 0..vocab-1 with equal probabilities.
float quantile_id(float u, int64_t vocab) {
  const double p = 0.5 * (1.0 + std::erf(static_cast<double>(u) / std::sqrt(2.0)));
  const auto id = std::clamp<int64_t>(static_cast<int64_t>(p * static_cast<double>(vocab)), 0,
                                      vocab - 1);
  return static_cast<float>(id);
}

Tensor ids(const SampleRange& s, const std::string& stream_name, int64_t seq, int64_t vocab, int threads) {
  const std::vector<float> proj = projection(s.seed, hash_name(stream_name), seq, threads);
  Tensor t = Tensor::zeros({s.rows, seq});
  plan::parallel_ranges(s.rows, threads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const Latent z = latent(s, r);
      for (int64_t p = 0; p < seq; ++p) t[r * seq + p] = quantile_id(project(proj, p, z), vocab);
    }
  });
  return t;
}
}  // namespace

Tensor synth_features(const SampleRange& s, const std::string& node, const std::string& module,
                      int64_t seq, int64_t in_dim, int threads) {
  const int64_t per_row = seq * in_dim;
  const std::vector<float> proj = projection(s.seed, hash_name("data/features/" + module), per_row, threads);
  const uint64_t noise = hash_name("data/noise/" + s.task + "/" + node);
  Tensor t = Tensor::zeros({s.rows, seq, in_dim});
  plan::parallel_ranges(s.rows, threads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const Latent z = latent(s, r);
      for (int64_t e = 0; e < per_row; ++e)
        t[r * per_row + e] = std::tanh(project(proj, e, z)) +
                             0.1f * normal01(s.seed, noise, (s.first_sample + r) * per_row + e);
    }
  });
  return t;
}

Tensor synth_tokens(const SampleRange& s, const std::string& module, int64_t seq, int64_t vocab, int threads) {
  return ids(s, "data/tokens/" + module, seq, vocab, threads);
}

Tensor synth_targets(const SampleRange& s, const std::string& module, int64_t seq, int64_t vocab, int threads) {
  return ids(s, "data/targets/" + module, seq, vocab, threads);
}

}  // namespace spindle::exec
