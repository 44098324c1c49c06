// libplan/util: the host allocator settings every program applies at start,
// and byte sizes as the tools print them.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "libplan/util/host_memory.h"
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
