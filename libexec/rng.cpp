#include "libexec/rng.h"

#include <cmath>

namespace spindle::exec {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t hash_name(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

static uint64_t draw(uint64_t seed, uint64_t stream, int64_t index) {
  return splitmix64(splitmix64(seed ^ splitmix64(stream)) + static_cast<uint64_t>(index));
}

float uniform_pm1(uint64_t seed, uint64_t stream, int64_t index) {
  const uint64_t bits = draw(seed, stream, index) >> 40;  // 24 bits
  return static_cast<float>(bits) * (2.0f / 16777216.0f) - 1.0f;
}

float normal01(uint64_t seed, uint64_t stream, int64_t index) {
  const uint64_t r = draw(seed, stream, index);
  const double u1 = (static_cast<double>(r >> 40) + 1.0) / 16777217.0;      // (0, 1]
  const double u2 = static_cast<double>((r >> 16) & 0xffffff) / 16777216.0;  // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace spindle::exec
