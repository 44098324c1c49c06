#include "libexec/exec/reshard.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace spindle::exec {

RowRange RowLayout::group_rows(int group) const {
  const int64_t g = groups();
  return {group * batch / g, (group + 1) * batch / g};
}

RowRange intersect(RowRange a, RowRange b) {
  const int64_t lo = std::max(a.begin, b.begin), hi = std::min(a.end, b.end);
  return hi > lo ? RowRange{lo, hi} : RowRange{lo, lo};
}

namespace {
void check(const RowLayout& p, const RowLayout& c) {
  if (p.batch != c.batch)
    throw std::invalid_argument("re-sharding between batches " + std::to_string(p.batch) +
                                " and " + std::to_string(c.batch));
}

// For every position of `to` (ascending), a move from TP rank 0 of each
// group of `from` whose rows overlap that position's rows.
std::vector<RowMove> moves(const RowLayout& from, const RowLayout& to) {
  std::vector<RowMove> out;
  for (int dst = 0; dst < to.devices; ++dst) {
    const RowRange need = to.rows_of(dst);
    for (int g = 0; g < from.groups(); ++g) {
      const RowRange r = intersect(need, from.group_rows(g));
      if (r.size() > 0) out.push_back({g * from.tp, dst, r});
    }
  }
  return out;
}
}  // namespace

std::vector<RowMove> forward_moves(const RowLayout& producer, const RowLayout& consumer) {
  check(producer, consumer);
  return moves(producer, consumer);
}

std::vector<RowMove> backward_moves(const RowLayout& producer, const RowLayout& consumer) {
  check(producer, consumer);
  return moves(consumer, producer);
}

}  // namespace spindle::exec
