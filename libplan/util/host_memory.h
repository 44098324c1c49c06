// How Spindle's programs ask the C library's allocator to keep the memory
// they free. spindle-run frees and allocates the same activation and
// gradient buffers every step, and the planner the same programs for every
// candidate; glibc's defaults hand freed memory at the top of the heap back
// to the kernel (above 128 KiB, a threshold it adapts as it goes) and map
// large blocks afresh, so each step faults the same pages in again. On the
// 2-core development VM that took 40% of spindle-run's step on tiny-clip
// (7.5 ms against 4.6, docs/runtime.md "Host memory"). Every program
// applies the same settings at start, so that a measured profile, a plan
// and a run see the same allocator.
#pragma once

#include <cstddef>

namespace spindle::plan {

// Blocks below this many bytes come from the heap, not a mapping of their
// own (glibc's largest allowed value on 64-bit: 32 MiB).
inline constexpr size_t kHostMmapThresholdBytes = size_t{32} << 20;
// Free memory kept at the top of the heap before any is handed back.
inline constexpr size_t kHostTrimThresholdBytes = size_t{1} << 30;

// Applies kHostMmapThresholdBytes and kHostTrimThresholdBytes (mallopt),
// unless `glibc_tunables` (the GLIBC_TUNABLES variable's value, or null)
// sets a glibc.malloc tunable: then the user's settings hold. Returns
// whether it applied them (false too without glibc, or when glibc refuses).
// Call it first thing in main, before the process allocates much.
bool keep_freed_host_memory(const char* glibc_tunables);

}  // namespace spindle::plan
