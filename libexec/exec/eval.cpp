#include "libexec/exec/eval.h"

#include <cmath>
#include <stdexcept>

namespace spindle::exec {

namespace {
// Rows of `t` scaled to unit length (zero rows stay zero), as [B, dim].
MatrixRM unit_rows(const Tensor& t, int64_t rows) {
  MatrixRM m = t.mat(rows, t.numel() / rows);
  for (int64_t i = 0; i < rows; ++i) {
    const float n = m.row(i).norm();
    if (n > 0) m.row(i) /= n;
  }
  return m;
}

// Hits of the queries (rows of `sim`, the cosine similarities q k^T)
// against the keys (its columns): each query's nearest key is the lowest
// column within kSimilarityTie of its largest similarity.
int64_t hits(const MatrixRM& sim, const Tensor& labels) {
  int64_t n = 0;
  for (int64_t i = 0; i < sim.rows(); ++i) {
    const float top = sim.row(i).maxCoeff();
    int64_t best = 0;
    while (sim(i, best) < top - kSimilarityTie) ++best;
    if (best == i || (!labels.empty() && labels[best] == labels[i])) ++n;
  }
  return n;
}
}  // namespace

RetrievalHits retrieval_hits(const Tensor& a, const Tensor& b, const Tensor& labels) {
  const int64_t rows = a.shape().empty() ? 0 : a.size(0);
  if (a.shape() != b.shape() || rows == 0 || (!labels.empty() && labels.numel() != rows))
    throw std::invalid_argument("retrieval_hits: inputs " + shape_str(a.shape()) + ", " + shape_str(b.shape()) +
                                " and labels " + shape_str(labels.shape()) + " do not match");
  const MatrixRM u = unit_rows(a, rows), w = unit_rows(b, rows);
  const MatrixRM sim = u * w.transpose();
  return {hits(sim, labels), hits(sim.transpose(), labels), rows};
}

}  // namespace spindle::exec
