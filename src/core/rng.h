// The project's one source of randomness, deterministic across compilers and standard libraries (std::
// distributions are implementation-defined, so they never feed anything reproducible):
//  - counter-based draws (rng_*_at): value i of stream s under seed k is a pure function of (k, s, i), so
//    weight init comes out the same on every backend, in any order, on any number of threads;
//  - Rng (xoshiro256**, state = four words a checkpoint can store) for sequential draws: shuffles, anchors.
#pragma once
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/host_device.h"

namespace df {

DF_HOST_DEVICE inline uint64_t rng_mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Combines a seed with one more value (epoch, bucket, batch index, stream id) into an unrelated seed.
DF_HOST_DEVICE inline uint64_t rng_mix(uint64_t a, uint64_t b) { return rng_mix64(a ^ rng_mix64(b)); }

DF_HOST_DEVICE inline uint64_t rng_u64_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return rng_mix64(rng_mix(seed, stream) + index);
}

// Uniform in (0, 1): 24 random bits, never exactly 0 (safe for log).
DF_HOST_DEVICE inline float rng_uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return (static_cast<float>(rng_u64_at(seed, stream, index) >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

// Standard normal by Box–Muller over two uniforms drawn at (2i, 2i+1). On the device the logarithm, root and
// cosine run in double: the kernels build with --use_fast_math, whose logf near 1 keeps too few bits for
// sqrt(−2·log u1), so the f32 forms would not give the host's draw; in double both agree to a few f32 ulps.
DF_HOST_DEVICE inline float rng_normal_at(uint64_t seed, uint64_t stream, uint64_t index) {
  float u1 = rng_uniform_at(seed, stream, 2 * index);
  float u2 = rng_uniform_at(seed, stream, 2 * index + 1);
#if defined(__CUDA_ARCH__)
  return static_cast<float>(sqrt(-2.0 * log(double(u1))) * cos(double(6.283185307179586f * u2)));
#else
  return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
#endif
}

// The stream of TrainOps::add_gaussian_noise: element (r, c) of a [rows, cols] tensor draws
// rng_normal_at(seed, kRngStreamTrainNoise, r·cols + c) on every backend ("noise" in ASCII).
constexpr uint64_t kRngStreamTrainNoise = 0x6e6f697365ull;

struct Rng {
  uint64_t s[4] = {0, 0, 0, 0};

  explicit Rng(uint64_t seed = 0) { reseed(seed); }

  // splitmix64 fills the state, so nearby seeds give unrelated streams and the state is never all zero.
  void reseed(uint64_t seed) {
    for (auto& w : s) {
      seed += 0x9e3779b97f4a7c15ull;
      w = rng_mix64(seed - 0x9e3779b97f4a7c15ull);
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

  // Uniform in [0, n), n > 0, without modulo bias (Lemire's multiply-and-reject).
  uint64_t below(uint64_t n) {
    unsigned __int128 m = static_cast<unsigned __int128>(next_u64()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next_u64()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
  // Uniform in [lo, hi] inclusive.
  int64_t range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1)); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Standard normal by Box–Muller (one value per call; the state stays four plain words).
  double normal() {
    const double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * 0x1.0p-53, u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
};

// Fisher–Yates with Rng::below, so the permutation depends only on the seed.
template <class T>
void rng_shuffle(Rng& rng, std::vector<T>& v) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

}  // namespace df
