#include "libplan/rules/rows.h"

#include <algorithm>
#include <vector>

namespace spindle::plan {

RowRange RowLayout::group_rows(int group) const {
  const int64_t g = groups();
  return {group * batch / g, (group + 1) * batch / g};
}

RowRange intersect(RowRange a, RowRange b) {
  const int64_t lo = std::max(a.begin, b.begin), hi = std::min(a.end, b.end);
  return hi > lo ? RowRange{lo, hi} : RowRange{lo, lo};
}

std::vector<RowMove> reshard_moves(const std::vector<int>& from, int from_tp, const std::vector<int>& to,
                                   int to_tp, int64_t batch, int devices_per_island) {
  std::vector<RowMove> out;
  for_each_reshard_move(from, from_tp, to, to_tp, batch, devices_per_island,
                        [&](const RowMove& m) { out.push_back(m); });
  return out;
}

}  // namespace spindle::plan
