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

// `a`, `b`: host tensors [B, ..., dim] (B rows of embeddings, the pair of
// row i being row i of the other side); `labels`: host [B] class per row,
// or empty. Row i's nearest row of the other side is the one of largest
// cosine similarity, the lowest row among equal ones; it is a hit when it
// is row i itself or, with labels, a row with row i's label. A zero row
// has similarity 0 to everything. Throws std::invalid_argument when the
// shapes disagree.
RetrievalHits retrieval_hits(const Tensor& a, const Tensor& b, const Tensor& labels);

}  // namespace spindle::exec
