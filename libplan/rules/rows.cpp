#include "libplan/rules/rows.h"

#include <algorithm>
#include <vector>

namespace spindle::plan {

std::vector<RowMove> reshard_moves(const std::vector<int>& from, int from_tp, const std::vector<int>& to,
                                   int to_tp, int64_t batch, int devices_per_island) {
  std::vector<RowMove> out;
  for_each_reshard_move(from, from_tp, to, to_tp, batch, devices_per_island,
                        [&](const RowMove& m) { out.push_back(m); });
  return out;
}

}  // namespace spindle::plan
