// Sorting by the bits of non-negative doubles (LSD radix sort), for the
// scheduler's two sorts that run tens of thousands of times on the largest
// workloads (1000 tasks: a wave draft has about 1850 candidate lengths and
// 900 ready MetaOps): the candidate wave lengths, and the ready MetaOps by
// remaining work. Faster there than std::sort or a heap, in the same order
// (docs/planner.md, "Where planning time goes").
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace spindle::plan {

// Whether x's IEEE 754 bit pattern, read as an unsigned integer, orders it
// among other such values: non-negative, not -0.0 (which would sort after
// every positive value), not NaN.
inline bool radix_orderable(double x) { return x >= 0.0 && !std::signbit(x); }

// A stable counting sort of a[0, n) by key(a[i]) (uint64_t) ascending, a
// byte at a time, least significant first, through b (n elements of
// working memory). A byte that every key shares costs no pass. Returns
// where the sorted elements are: a or b.
template <class T, class Key>
T* radix_sort_by_key(T* a, T* b, size_t n, Key key) {
  // Per byte position, how many keys have each byte value.
  std::array<std::array<uint32_t, 256>, 8> counts{};
  for (size_t i = 0; i < n; ++i) {
    const uint64_t k = key(a[i]);
    for (int p = 0; p < 8; ++p) ++counts[static_cast<size_t>(p)][(k >> (8 * p)) & 0xff];
  }
  for (int p = 0; p < 8; ++p) {
    std::array<uint32_t, 256>& c = counts[static_cast<size_t>(p)];
    if (n == 0 || c[(key(a[0]) >> (8 * p)) & 0xff] == n) continue;   // every key has this byte
    uint32_t sum = 0;
    for (uint32_t& x : c) {
      const uint32_t here = x;
      x = sum;
      sum += here;
    }
    for (size_t i = 0; i < n; ++i) b[c[(key(a[i]) >> (8 * p)) & 0xff]++] = a[i];
    std::swap(a, b);
  }
  return a;
}

// Sorts `v` ascending, exactly as std::sort would order it, when every value
// is radix_orderable; returns false, `v` untouched, otherwise. `scratch` is
// working memory kept by the caller from one call to the next.
inline bool radix_sort_non_negative(std::vector<double>& v, std::vector<uint64_t>& scratch) {
  const size_t n = v.size();
  if (n >= (size_t{1} << 32)) return false;   // counts are 32-bit
  scratch.resize(2 * n);
  uint64_t* keys = scratch.data();
  for (size_t i = 0; i < n; ++i) {
    if (!radix_orderable(v[i])) return false;
    keys[i] = std::bit_cast<uint64_t>(v[i]);
  }
  const uint64_t* sorted = radix_sort_by_key(keys, keys + n, n, [](uint64_t k) { return k; });
  for (size_t i = 0; i < n; ++i) v[i] = std::bit_cast<double>(sorted[i]);
  return true;
}

// One item and its key, for radix_order_descending.
struct RadixItem {
  uint64_t key = 0;
  int item = 0;
};

// Sorts `items` by value_of[item] descending, items of equal value kept in
// the order given (stable): for `items` ascending, the order of
// (-value, item) ascending. Returns false, `items` untouched, when a value
// is not radix_orderable. `scratch` is working memory kept by the caller.
inline bool radix_order_descending(std::vector<int>& items, const std::vector<double>& value_of,
                                   std::vector<RadixItem>& scratch) {
  const size_t n = items.size();
  if (n >= (size_t{1} << 32)) return false;
  scratch.resize(2 * n);
  RadixItem* a = scratch.data();
  for (size_t i = 0; i < n; ++i) {
    const double v = value_of[static_cast<size_t>(items[i])];
    if (!radix_orderable(v)) return false;
    a[i] = {~std::bit_cast<uint64_t>(v), items[i]};   // complemented: the largest value first
  }
  const RadixItem* sorted = radix_sort_by_key(a, a + n, n, [](const RadixItem& x) { return x.key; });
  for (size_t i = 0; i < n; ++i) items[i] = sorted[i].item;
  return true;
}

}  // namespace spindle::plan
