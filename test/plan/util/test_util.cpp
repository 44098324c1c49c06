// libplan/util: the host allocator settings every program applies at start,
// byte sizes as the tools print them, and the scheduler's radix sort.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "libplan/util/host_memory.h"
#include "libplan/util/radix_sort.h"
#include "libplan/util/units.h"
#include "libplan/util/units.h"

using namespace spindle::plan;

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPINDLE_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SPINDLE_TEST_ASAN 1
#endif

TEST_CASE("keep_freed_host_memory: a user's glibc.malloc tunables are left as given") {
  CHECK_FALSE(keep_freed_host_memory("glibc.malloc.trim_threshold=4096"));
  CHECK_FALSE(keep_freed_host_memory("glibc.rtld.nns=4:glibc.malloc.tcache_count=0"));
}

#if defined(__GLIBC__) && !defined(SPINDLE_TEST_ASAN)   // AddressSanitizer brings its own allocator
TEST_CASE("keep_freed_host_memory: blocks under 32 MiB come from the heap and stay there once freed") {
  REQUIRE(keep_freed_host_memory(nullptr));
  REQUIRE(keep_freed_host_memory("glibc.rtld.nns=4"));   // other tunables do not count
  // 8 MiB: above glibc's default 128 KiB threshold for a mapping of its
  // own, below ours. Allocated and touched, it maps nothing; freed, the
  // heap keeps it (under 1 GiB free at the top is not handed back).
  const size_t bytes = size_t{8} << 20;
  const struct mallinfo2 before = mallinfo2();
  char* block = static_cast<char*>(std::malloc(bytes));
  REQUIRE(block != nullptr);
  std::memset(block, 1, bytes);
  const struct mallinfo2 held = mallinfo2();
  CHECK(held.hblkhd == before.hblkhd);                 // no mapping of its own
  CHECK(held.arena >= before.arena);
  CHECK(held.uordblks >= before.uordblks + bytes);     // in use, from the heap
  std::free(block);
  const struct mallinfo2 after = mallinfo2();
  CHECK(after.arena == held.arena);                    // not trimmed
  CHECK(after.fordblks >= bytes);                      // kept free for the next step
}
#endif

TEST_CASE("human_bytes: the largest binary unit reached, with the decimals asked for") {
  using spindle::plan::human_bytes;
  CHECK(human_bytes(80.0 * (1u << 30)) == "80.0 GiB");
  CHECK(human_bytes(static_cast<double>(1u << 30)) == "1.0 GiB");
  CHECK(human_bytes(static_cast<double>(1u << 30) - 1) == "1024.0 MiB");   // just below: rounds in MiB
  CHECK(human_bytes(2415919, 2) == "2.30 MiB");
  CHECK(human_bytes(1536) == "1.5 KiB");
  CHECK(human_bytes(1023) == "1023 B");
  CHECK(human_bytes(0) == "0 B");
}

TEST_CASE("number_text: the shortest decimal that reads back, plain from 1e-6 to 1e21") {
  using spindle::plan::number_text;
  CHECK(number_text(25.0) == "25");
  CHECK(number_text(0.001) == "0.001");
  CHECK(number_text(0.0009) == "0.0009");     // plain: shorter in scientific ("9e-04")
  CHECK(number_text(1e-6) == "0.000001");
  CHECK(number_text(9.9e-7) == "9.9e-07");
  CHECK(number_text(1048576.0) == "1048576");
  CHECK(number_text(1e20) == "100000000000000000000");
  CHECK(number_text(1e21) == "1e+21");
  CHECK(number_text(-1.0) == "-1");
  CHECK(number_text(0.0) == "0");
  CHECK(number_text(1e-30) == "1e-30");        // std::to_string: "0.000000"
  CHECK(number_text(1e300) == "1e+300");       // std::to_string: 301 digits
  CHECK(number_text(0.1 + 0.2) == "0.30000000000000004");
  CHECK(number_text(1e30f) == "1e+30");        // the float, not the double it widens to
  CHECK(number_text(std::numeric_limits<double>::infinity()) == "inf");
  CHECK(number_text(std::numeric_limits<double>::quiet_NaN()) == "nan");
  // Round trip across the exponent range, both notations.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1000; ++i) {
    const double x = std::ldexp(std::uniform_real_distribution<double>(1, 2)(rng), static_cast<int>(rng() % 2000) - 1000);
    CAPTURE(x);
    CHECK(std::stod(number_text(x)) == x);
    const float f = static_cast<float>(std::ldexp(std::uniform_real_distribution<double>(1, 2)(rng),
                                                  static_cast<int>(rng() % 240) - 120));
    CAPTURE(f);
    CHECK(std::stof(number_text(f)) == f);
  }
}

TEST_CASE("radix_sort_non_negative: the order std::sort gives, or refuses and leaves the values") {
  std::vector<uint64_t> scratch;
  std::mt19937_64 rng(20261205);
  // Wave lengths as the scheduler makes them (multiples k x t of operator
  // times, many equal), and values spread over the whole exponent range.
  for (int round = 0; round < 200; ++round) {
    CAPTURE(round);
    std::vector<double> v;
    const size_t n = rng() % 3000;
    std::uniform_real_distribution<double> ms(0.01, 50.0);
    for (size_t i = 0; i < n; ++i) {
      switch (rng() % 5) {
        case 0: v.push_back(static_cast<double>(1 + rng() % 24) * 1.25); break;   // exact repeats
        case 1: v.push_back(std::ldexp(ms(rng), static_cast<int>(rng() % 200) - 100)); break;
        case 2: v.push_back(round % 7 == 0 ? 0.0 : ms(rng)); break;
        case 3: {   // a few ulps from 8 ms: only the lowest byte differs
          double x = 8.0;
          for (uint64_t k = rng() % 200; k > 0; --k) x = std::nextafter(x, 9.0);
          v.push_back(x);
          break;
        }
        default: v.push_back(ms(rng)); break;
      }
    }
    if (round % 11 == 0) v.push_back(std::numeric_limits<double>::infinity());
    if (round % 13 == 0) v.push_back(std::numeric_limits<double>::denorm_min());
    std::vector<double> expected = v;
    std::sort(expected.begin(), expected.end());
    REQUIRE(radix_sort_non_negative(v, scratch));
    CHECK(v == expected);
  }
  // By hand: bytes that differ only low, only high, and shared.
  std::vector<double> v = {3.0, 2.0000000000000004, 1.0, 2.0, 1.0, 0.0, 1e300, 1e-300};
  REQUIRE(radix_sort_non_negative(v, scratch));
  CHECK(v == std::vector<double>{0.0, 1e-300, 1.0, 1.0, 2.0, 2.0000000000000004, 3.0, 1e300});
  std::vector<double> empty;
  CHECK(radix_sort_non_negative(empty, scratch));
  CHECK(empty.empty());

  // Negative values, -0.0 and NaN do not sort by their bits: refused, and
  // the values are left as they were for std::sort.
  for (double bad : {-1.0, -0.0, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(bad);
    std::vector<double> w = {2.0, bad, 1.0};
    CHECK_FALSE(radix_sort_non_negative(w, scratch));
    CHECK(w[0] == 2.0);
    CHECK(w[2] == 1.0);
    CHECK(std::signbit(w[1]) == std::signbit(bad));
  }
}

TEST_CASE("radix_order_descending: most first, ties in the order given, as the scheduler's heap pops them") {
  std::vector<RadixItem> scratch;
  std::mt19937_64 rng(5122026);
  for (int round = 0; round < 100; ++round) {
    CAPTURE(round);
    const size_t n = rng() % 1500;
    std::vector<double> work(2 * n + 1);
    for (double& w : work)   // many ties, zeros and a wide range
      w = rng() % 4 == 0 ? static_cast<double>(rng() % 5) : std::ldexp(static_cast<double>(rng() % 1000) + 0.5, static_cast<int>(rng() % 40) - 20);
    std::vector<int> items;
    for (int i = 0; i < static_cast<int>(work.size()); ++i)
      if (rng() % 2) items.push_back(i);   // ascending ids, as ready_ is
    // The reference: the heap of (-work, id) that by_work pops from.
    std::vector<std::pair<double, int>> heap;
    for (int m : items) heap.emplace_back(-work[static_cast<size_t>(m)], m);
    std::make_heap(heap.begin(), heap.end(), std::greater<>());
    std::vector<int> expected;
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      expected.push_back(heap.back().second);
      heap.pop_back();
    }
    REQUIRE(radix_order_descending(items, work, scratch));
    CHECK(items == expected);
  }
  // By hand: 3.0 first, the two 2.0s in the order given, 0.0 last.
  std::vector<double> work = {2.0, 0.0, 3.0, 2.0};
  std::vector<int> items = {0, 1, 2, 3};
  REQUIRE(radix_order_descending(items, work, scratch));
  CHECK(items == std::vector<int>{2, 0, 3, 1});
  items = {3, 0};   // the order given decides the tie
  REQUIRE(radix_order_descending(items, work, scratch));
  CHECK(items == std::vector<int>{3, 0});
  // A value that does not order by its bits: refused, untouched.
  work[1] = -1.0;
  items = {0, 1, 2};
  CHECK_FALSE(radix_order_descending(items, work, scratch));
  CHECK(items == std::vector<int>{0, 1, 2});
}
