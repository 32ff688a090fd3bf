// The float8 e4m3fn format of published FP8 checkpoints (torch.float8_e4m3fn, safetensors F8_E4M3): 1 sign,
// 4 exponent bits (bias 7), 3 mantissa bits, subnormals, no infinities, NaN = S.1111.111, max finite 448.
// Header-only and free of CUDA headers so loaders, writers and tests share the one definition of the
// rounding, the one the CUDA quantiser (kernels/gemm/fp8_quant.cu) gets from the hardware's conversion.
#pragma once
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/host_device.h"

namespace df {

constexpr float kE4m3Max = 448.0f;

// The scale of a group of values quantised together to e4m3 (a weight block, a row): amax / 448 maps the
// largest to the largest code. An all-zero group, or one so small that its scale is below the smallest normal
// f32, takes 1: its codes are all zero anyway (|x| < 448 · 2^-126), a zero scale would turn them into 0/0,
// and a subnormal one would have an infinite reciprocal (e4m3_quantize). kernels/gemm/fp8_quant.cu computes the
// same with IEEE-rounded, denormal-keeping PTX (its library is built with --use_fast_math).
inline float e4m3_scale(float amax) {
  const float s = amax / kE4m3Max;
  return s >= std::numeric_limits<float>::min() ? s : 1.0f;
}

// Exact: every e4m3 value is an f32 (a 4-bit significand times a power of two in [2^-9, 2^8]).
inline float e4m3_to_f32(uint8_t c) {
  const uint32_t exp = (c >> 3) & 0xfu, mant = c & 0x7u;
  if (exp == 0xfu && mant == 0x7u) return std::numeric_limits<float>::quiet_NaN();
  // Subnormal: mant · 2^-9; normal: the f32 with the same mantissa bits and the exponent rebiased 7 -> 127.
  float mag = static_cast<float>(mant) * (1.0f / 512.0f);
  if (exp != 0) {
    const uint32_t u = ((exp + 127 - 7) << 23) | (mant << 20);
    std::memcpy(&mag, &u, 4);
  }
  return (c & 0x80u) ? -mag : mag;
}

// Round to nearest even; magnitudes above 448 saturate to ±448 (the format has no infinity, and the
// quantiser multiplies by 448/amax so only rounding noise can reach past it); every NaN becomes the one
// canonical NaN code 0x7f, whatever its sign. This is Hopper's cvt.rn.satfinite.e4m3x2.f32, which the CUDA
// quantiser runs instead (cuda_fp8.hpp's host model of that instruction canonicalises NaN the same way);
// tests/unit/test_fp8.cpp checks the two definitions agree on every class of f32.
inline uint8_t f32_to_e4m3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fu;
  if (a >= 0x43e00000u) return sign | 0x7eu;  // |f| >= 448, infinities included
  if (a >= 0x3c800000u) {                     // |f| >= 2^-6: normal in e4m3
    // Keep 3 of the 23 mantissa bits, rounding the other 20 to nearest even; a carry bumps the exponent,
    // which is the right answer (1.111b rounds up to 10.000b).
    const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    return sign | static_cast<uint8_t>(r - ((127u - 7u) << 3));
  }
  // Subnormal: k · 2^-9 with k in [0, 8] (k = 8 is the smallest normal, code 0x08). Scaling by 2^9 is exact.
  float x;
  std::memcpy(&x, &a, 4);
  x *= 512.0f;
  uint32_t k = static_cast<uint32_t>(x);
  const float frac = x - static_cast<float>(k);
  if (frac > 0.5f || (frac == 0.5f && (k & 1u))) ++k;
  return sign | static_cast<uint8_t>(k);
}

// A group's codes are its values times the IEEE reciprocal of its scale, computed once per group: one
// multiplication per element instead of a division (the CUDA quantiser is compute-bound on the division;
// __fdiv_rn is a long instruction sequence). x · rn(1/s) can differ from rn(x/s) in the last f32 bit, which
// moves a code only when that bit decides an e4m3 rounding (a value within an f32 ulp of a midpoint between
// codes); the scale stays amax/448 and the amax element still maps to ±448. Every CPU path
// (CpuOps::fp8_round_rows, the checkpoint writer fp8_quantize, the tests' references) quantises through here,
// so all agree with the kernel.
inline float e4m3_inv_scale(float scale) {
  return 1.0f / scale;
}
inline uint8_t e4m3_quantize(float x, float inv_scale) {
  return f32_to_e4m3(x * inv_scale);
}

// Where the input scale of row r, 128-column group g sits for the block-scaled FP8 GEMM of `rows` rows and
// `groups` groups (kernels/gemm/fp8_group_quant.cu writes it, gemm_fp8_block_launch reads it). cuBLASLt's VEC128
// scales are [groups, rows] row-contiguous, and on the H200 (cuBLASLt 13.1) its heuristic refuses every row
// count that is not a multiple of 4. So the first rows4 = rows rounded down to 4 rows keep that layout
// [groups, rows4], and the last rows - rows4 (< 4) follow as a [groups, 4] tail that a second, 4-row GEMM
// reads; fp8_group_scales_size is the whole buffer.
DF_HOST_DEVICE inline int64_t fp8_group_scale_index(int64_t r, int64_t g, int64_t rows, int64_t groups) {
  const int64_t rows4 = rows & ~int64_t(3);
  return r < rows4 ? g * rows4 + r : groups * rows4 + g * 4 + (r - rows4);
}
inline int64_t fp8_group_scales_size(int64_t rows, int64_t groups) {
  return groups * ((rows + 3) & ~int64_t(3));
}

// The row stride of a weight's 128x128 block scales (Ops::gemm_fp8_block, the FP8 experts' grouped GEMM), for
// K inputs: ceil(K/128) rounded up to a multiple of 4, as PyTorch's _scaled_mm lays them out for cuBLASLt.
DF_HOST_DEVICE inline int64_t fp8_block_scale_ld(int64_t K) {
  return ((K + 127) / 128 + 3) / 4 * 4;
}

}  // namespace df
