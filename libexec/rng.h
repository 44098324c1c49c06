// Counter-based random numbers for parameter initialisation and synthetic
// data. A value depends only on (seed, stream name, element index), never on
// the order of calls or on which device draws it, so a tensor-parallel shard
// draws exactly the elements of the full tensor it holds, and every device
// count initialises identically.
#pragma once

#include <cstdint>
#include <string_view>

namespace spindle::exec {

uint64_t splitmix64(uint64_t x);
// FNV-1a 64-bit hash of a name (e.g. "vision/1.3/w_qkv").
uint64_t hash_name(std::string_view name);

// Uniform in [-1, 1), 24-bit resolution: a function of (seed, stream, index).
float uniform_pm1(uint64_t seed, uint64_t stream, int64_t index);
// Standard normal (Box-Muller on two counter-based uniforms).
float normal01(uint64_t seed, uint64_t stream, int64_t index);

}  // namespace spindle::exec
