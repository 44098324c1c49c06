// Synthetic training data with a learnable signal.
//
// Sample j of task T has a latent z in R^kLatentDim (standard normals drawn
// from (seed, T, j)). Every modality of the sample is a fixed function of z,
// so paired modalities agree (CLIP losses can fall) and lm targets depend on
// the inputs:
//   patch_embed features  x[t, c] = tanh(P_M[t, c] . z / sqrt(L)) + 0.1 noise
//   token_embed ids       id[t]   = quantile_V(Q_M[t] . z / sqrt(L))
//   lm_loss targets       y[t]    = quantile_V(R_M[t] . z / sqrt(L))
// where P_M, Q_M, R_M are fixed random projections of the module M (the same
// modality looks the same in every task), quantile_V maps N(0,1) to
// 0..V-1 through its CDF, and the noise depends on (seed, T, node, j).
// A value depends only on (seed, task, node/module, sample, position): the
// same on every device count, whichever device draws it, and however many
// threads draw it. A read draws the projection rows it needs once for all
// its samples (seq x in_dim x L normals), then per value one noise normal
// and L multiply-adds: about 85 ns per value on one core of the development
// machine, 13 ms per ViT-H image (257 x 588 values), several times what an
// H200 spends on the image's forward and backward pass (bench/data_read).
// `threads` (>= 1) splits the rows, and the projection, over that many
// threads.
#pragma once

#include <cstdint>
#include <string>

#include "libexec/tensor.h"

namespace spindle::exec {

inline constexpr int kLatentDim = 8;

// Which samples: rows [first_sample, first_sample + rows) of task `task`.
struct SampleRange {
  uint64_t seed = 0;
  std::string task;
  int64_t first_sample = 0;  // global sample index j of the first row
  int64_t rows = 0;
};

// [rows, seq, in_dim] features for a patch_embed node `node` of module `module`.
Tensor synth_features(const SampleRange& s, const std::string& node, const std::string& module,
                      int64_t seq, int64_t in_dim, int threads = 1);
// [rows, seq] token ids in 0..vocab-1 (as fp32) for a token_embed module.
Tensor synth_tokens(const SampleRange& s, const std::string& module, int64_t seq, int64_t vocab,
                    int threads = 1);
// [rows, seq] lm targets in 0..vocab-1 (as fp32) for an lm_loss of module `module`.
Tensor synth_targets(const SampleRange& s, const std::string& module, int64_t seq, int64_t vocab,
                     int threads = 1);

}  // namespace spindle::exec
