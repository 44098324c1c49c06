#include "libplan/util/host_memory.h"

#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace spindle::plan {

bool keep_freed_host_memory(const char* glibc_tunables) {
#if defined(__GLIBC__)
  if (glibc_tunables != nullptr && std::strstr(glibc_tunables, "glibc.malloc.") != nullptr) return false;
  // Setting either also stops glibc adapting the other as it goes.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHostMmapThresholdBytes)) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kHostTrimThresholdBytes)) == 1;
  return mmap_ok && trim_ok;
#else
  (void)glibc_tunables;
  return false;
#endif
}

}  // namespace spindle::plan
