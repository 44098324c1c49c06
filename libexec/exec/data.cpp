#include "libexec/exec/data.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "libexec/rng.h"

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

// Projection row `index` of stream `stream` applied to z, about N(0, 1).
float project(uint64_t seed, uint64_t stream, int64_t index, const Latent& z) {
  float u = 0;
  for (int l = 0; l < kLatentDim; ++l)
    u += normal01(seed, stream, index * kLatentDim + l) * z[static_cast<size_t>(l)];
  return u / std::sqrt(static_cast<float>(kLatentDim));
}

// N(0,1) value -> id in 0..vocab-1 with equal probabilities.
float quantile_id(float u, int64_t vocab) {
  const double p = 0.5 * (1.0 + std::erf(static_cast<double>(u) / std::sqrt(2.0)));
  const auto id = std::clamp<int64_t>(static_cast<int64_t>(p * static_cast<double>(vocab)), 0,
                                      vocab - 1);
  return static_cast<float>(id);
}

Tensor ids(const SampleRange& s, const std::string& stream_name, int64_t seq, int64_t vocab) {
  const uint64_t stream = hash_name(stream_name);
  Tensor t = Tensor::zeros({s.rows, seq});
  for (int64_t r = 0; r < s.rows; ++r) {
    const Latent z = latent(s, r);
    for (int64_t p = 0; p < seq; ++p) t[r * seq + p] = quantile_id(project(s.seed, stream, p, z), vocab);
  }
  return t;
}
}  // namespace

Tensor synth_features(const SampleRange& s, const std::string& node, const std::string& module,
                      int64_t seq, int64_t in_dim) {
  const uint64_t proj = hash_name("data/features/" + module);
  const uint64_t noise = hash_name("data/noise/" + s.task + "/" + node);
  Tensor t = Tensor::zeros({s.rows, seq, in_dim});
  const int64_t per_row = seq * in_dim;
  for (int64_t r = 0; r < s.rows; ++r) {
    const Latent z = latent(s, r);
    for (int64_t e = 0; e < per_row; ++e)
      t[r * per_row + e] = std::tanh(project(s.seed, proj, e, z)) +
                           0.1f * normal01(s.seed, noise, (s.first_sample + r) * per_row + e);
  }
  return t;
}

Tensor synth_tokens(const SampleRange& s, const std::string& module, int64_t seq, int64_t vocab) {
  return ids(s, "data/tokens/" + module, seq, vocab);
}

Tensor synth_targets(const SampleRange& s, const std::string& module, int64_t seq, int64_t vocab) {
  return ids(s, "data/targets/" + module, seq, vocab);
}

}  // namespace spindle::exec
