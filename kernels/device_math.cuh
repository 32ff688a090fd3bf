// Small device helpers shared by the kernel families: bf16 rounding that mirrors a torch bf16 op,
// SiLU/sigmoid in fp32, and warp/block sums.
#pragma once
#include <cuda_bf16.h>

namespace df {

// What storing an fp32 result into a bf16 tensor does (round to nearest even).
__device__ __forceinline__ float bf16_rn(float x) { return __bfloat162float(__float2bfloat16(x)); }

__device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float silu_f32(float x) { return x * sigmoid_f32(x); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, ≤ 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  v = warp_sum(v);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  int nw = blockDim.x >> 5;
  float t = lane < nw ? partial[lane] : 0.0f;
  return warp_sum(t);
}

}  // namespace df
