// Device pieces of the row-wise e4m3 quantiser for every kernel that quantises a row it holds in registers
// (fp8_quant.cu's, rmsnorm.cu's fused norm): the IEEE scale and reciprocal, the hardware conversion of value
// pairs, and a whole held row to codes + scale, so that every path rounds alike.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "core/fp8.h"
#include "kernels/primitives/device_math.cuh"

namespace df {

// IEEE f32 arithmetic whatever the library's --use_fast_math says: its -ftz=true turns '/', __fdiv_rn,
// __frcp_rn and __fmul_rn into .ftz forms that flush subnormal inputs and results, where the CPU keeps them.
__device__ __forceinline__ float ieee_div(float a, float b) {
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float ieee_rcp(float a) {
  float r;
  asm("rcp.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}
__device__ __forceinline__ float ieee_mul(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// core/fp8.h e4m3_scale: amax / 448, 1 below the smallest normal f32.
__device__ __forceinline__ float row_scale(float amax) {
  const float s = ieee_div(amax, kE4m3Max);
  return s >= FLT_MIN ? s : 1.0f;
}

// max |x| over eight bf16 as max over four bf16 pairs: exact (the max of bf16 values is one of them), and
// __hmax2 returns the other operand of a NaN as fmaxf does, so NaN is skipped like the CPU's std::max(amax,
// NaN).
__device__ __forceinline__ float abs_max8(const uint4& raw, float amax) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&raw);
  __nv_bfloat162 m = __habs2(p[0]);
#pragma unroll
  for (int j = 1; j < 4; ++j) m = __hmax2(m, __habs2(p[j]));
  return fmaxf(amax, fmaxf(__low2float(m), __high2float(m)));
}

// Two values times the row's reciprocal to two e4m3 codes (a's in the low byte): one cvt for the pair.
__device__ __forceinline__ uint32_t e4m3x2(float a, float b, float inv) {
  return __nv_cvt_float2_to_fp8x2(make_float2(ieee_mul(a, inv), ieee_mul(b, inv)), __NV_SATFINITE, __NV_E4M3);
}

// Code pair back to code · s: e4m3 -> f16 is exact (every e4m3 value is an f16 one), f16 -> f32 too.
__device__ __forceinline__ float2 e4m3x2_dequant(uint32_t codes, float s) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  return make_float2(ieee_mul(f.x, s), ieee_mul(f.y, s));
}

// Eight bf16 (one 16-byte load) to eight codes (one 8-byte store); with back non-null also code · s in bf16.
__device__ __forceinline__ uint2 quantize8(const uint4& raw, float inv, float s, uint4* back) {
  float v[8];
  bf16x8_unpack(raw, v);
  uint32_t w[2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    w[h] = e4m3x2(v[4 * h], v[4 * h + 1], inv) | e4m3x2(v[4 * h + 2], v[4 * h + 3], inv) << 16;
  if (back) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const float2 d = e4m3x2_dequant(w[p / 2] >> (16 * (p % 2)), s);
      v[2 * p] = d.x;
      v[2 * p + 1] = d.y;
    }
    *back = bf16x8_pack(v);
  }
  return make_uint2(w[0], w[1]);
}

// The codes and scale of a row a block holds as R 16-byte chunks per thread (chunk k of thread t is the row's
// chunk t + k·blockDim.x, zeros past the row's n chunks): the amax over them, scale[0] = amax / 448 (thread
// 0), then each chunk to eight codes at qr[i]; with back non-null also code · scale in bf16 at back[i].
template <int R>
__device__ __forceinline__ void fp8_quantize_held_row(const uint4 (&raw)[R], int64_t n, uint2* qr,
                                                      float* scale, uint4* back) {
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < R; ++k) amax = abs_max8(raw[k], amax);
  const float s = row_scale(block_max(amax)), inv = ieee_rcp(s);
  if (threadIdx.x == 0) *scale = s;
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < n) qr[i] = quantize8(raw[k], inv, s, back ? back + i : nullptr);
  }
}

}  // namespace df
