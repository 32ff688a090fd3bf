// The training RNG (xoshiro256**): small plain state (four uint64) so a checkpoint can store it and a resumed
// run draws the same anchors and noise seeds. Seeded through splitmix64 so nearby seeds give unrelated streams.
#pragma once
#include <cmath>
#include <cstdint>

namespace df {

struct Rng {
  uint64_t s[4] = {0, 0, 0, 0};

  explicit Rng(uint64_t seed = 0) { reseed(seed); }

  void reseed(uint64_t seed) {
    for (auto& w : s) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      w = z ^ (z >> 31);
    }
  }

  uint64_t next_u64() {
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
  }

  // Uniform in [0, n), unbiased (rejection of the short top range).
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next_u64();
    while (x >= limit);
    return x % n;
  }

  double uniform01() { return double(next_u64() >> 11) * 0x1.0p-53; }

  // Standard normal by Box–Muller (one draw per call; the second value is dropped to keep the state plain).
  double normal() {
    const double u1 = (double(next_u64() >> 11) + 1.0) * 0x1.0p-53, u2 = uniform01();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
};

}  // namespace df
