// Counter-based random numbers: value i of stream s under seed k is a pure function of (k, s, i), so the
// same initialisation comes out on any backend, in any order, on any number of threads.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define DF_HOST_DEVICE __host__ __device__
#else
#define DF_HOST_DEVICE
#endif

namespace df {

DF_HOST_DEVICE inline uint64_t rng_mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

DF_HOST_DEVICE inline uint64_t rng_u64_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return rng_mix64(rng_mix64(seed ^ rng_mix64(stream)) + index);
}

// Uniform in (0, 1): 24 random bits, never exactly 0 (safe for log).
DF_HOST_DEVICE inline float rng_uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return (static_cast<float>(rng_u64_at(seed, stream, index) >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

// Standard normal by Box–Muller over two uniforms drawn at (2i, 2i+1).
DF_HOST_DEVICE inline float rng_normal_at(uint64_t seed, uint64_t stream, uint64_t index) {
  float u1 = rng_uniform_at(seed, stream, 2 * index);
  float u2 = rng_uniform_at(seed, stream, 2 * index + 1);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
}

}  // namespace df
