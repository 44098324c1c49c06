// Sorting non-negative doubles by their bits (LSD radix sort), for the
// scheduler's candidate wave lengths: thousands of values per wave draft and
// tens of thousands of drafts on the largest workloads (1000 tasks), where
// std::sort was 7% of planning (docs/planner.md, "Where planning time goes").
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

namespace spindle::plan {

// Sorts `v` ascending, exactly as std::sort would order it, when every value
// is a non-negative, non-NaN double (+0.0 and -0.0 are not both present: a
// -0.0 would sort after every positive value, so it is left to std::sort);
// returns false, `v` untouched, otherwise. For such values the IEEE 754 bit
// pattern read as an unsigned integer increases with the value, so a
// byte-by-byte counting sort of the patterns, least significant byte first,
// sorts the values. A byte that every value shares costs no pass.
// `scratch` is working memory kept by the caller from one call to the next.
inline bool radix_sort_non_negative(std::vector<double>& v, std::vector<uint64_t>& scratch) {
  const size_t n = v.size();
  scratch.resize(2 * n);
  uint64_t* keys = scratch.data();
  uint64_t* other = scratch.data() + n;
  if (n >= (size_t{1} << 32)) return false;   // counts are 32-bit
  // Per byte position, how many keys have each byte value.
  std::array<std::array<uint32_t, 256>, 8> counts{};
  for (size_t i = 0; i < n; ++i) {
    if (!(v[i] >= 0.0) || std::signbit(v[i])) return false;   // negative, -0.0 or NaN
    const uint64_t k = std::bit_cast<uint64_t>(v[i]);
    keys[i] = k;
    for (int b = 0; b < 8; ++b) ++counts[static_cast<size_t>(b)][(k >> (8 * b)) & 0xff];
  }
  for (int b = 0; b < 8; ++b) {
    std::array<uint32_t, 256>& c = counts[static_cast<size_t>(b)];
    if (n == 0 || c[(keys[0] >> (8 * b)) & 0xff] == n) continue;   // every key has this byte
    uint32_t sum = 0;
    for (uint32_t& x : c) {
      const uint32_t here = x;
      x = sum;
      sum += here;
    }
    for (size_t i = 0; i < n; ++i) other[c[(keys[i] >> (8 * b)) & 0xff]++] = keys[i];
    std::swap(keys, other);
  }
  for (size_t i = 0; i < n; ++i) v[i] = std::bit_cast<double>(keys[i]);
  return true;
}

}  // namespace spindle::plan
