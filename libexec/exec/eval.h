// Top-1 retrieval accuracy of a contrastive pair (docs/spec/data.md,
// "Evaluation").
#pragma once

#include <cstdint>

#include "libexec/tensor.h"

namespace spindle::exec {

struct RetrievalHits {
  int64_t a_to_b = 0;   // queries of a whose top-1 in b is a hit
  int64_t b_to_a = 0;   // and back
  int64_t queries = 0;  // rows (queries per direction)
};

// Cosine similarities this close count as equal (the lowest row wins).
// Identical inputs (a caption that occurs twice in a batch) give identical
// embeddings on one device, but on several their rows may sit on different
// ranks and differ by fp32 rounding (1e-7); compared exactly, the tie went
// to whichever came out larger, and the accuracy changed with the plan
// (random models with repeated token sequences: 0.229 against 0.25).
inline constexpr float kSimilarityTie = 1e-5f;

// `a`, `b`: host tensors [B, ..., dim] (B rows of embeddings, the pair of
// row i being row i of the other side); `labels`: host [B] class per row,
// or empty. Row i's nearest row of the other side is the one of largest
// cosine similarity, the lowest row among those within kSimilarityTie of
// it; it is a hit when it is row i itself or, with labels, a row with row
// i's label. A zero row has similarity 0 to everything. Throws
// std::invalid_argument when the shapes disagree.
RetrievalHits retrieval_hits(const Tensor& a, const Tensor& b, const Tensor& labels);

}  // namespace spindle::exec
