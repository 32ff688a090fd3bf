// Row-wise e4m3 quantisation for the FP8 target (weights at load, each linear layer's input per token): the
// codes and f32 scales the FP8 GEMM (gemm.cuh gemm_fp8_launch) multiplies, bit-identical to the CPU oracle's
// CpuOps::fp8_round_rows, which is why the rounding itself is core/fp8.h's and the divisions are IEEE ones.
#include "core/fp8.h"
#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

namespace {

constexpr int kQuantThreads = 256;

__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float t = lane < int(blockDim.x >> 5) ? partial[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
  return t;
}

// One block per row: the row's amax, then every element divided by amax/448 and rounded to e4m3. The library
// is built with --use_fast_math, whose '/' is an approximation: __fdiv_rn is the IEEE division the CPU does.
// fmaxf skips NaN as the CPU's std::max(amax, NaN) does, so a row's scale never is NaN. VEC: eight elements
// per step through 16-byte loads of x and 8-byte stores of the codes (rows aligned so, cols a multiple of 8);
// the second pass re-reads a row the first just brought into cache.
template <bool VEC>
__global__ void fp8_quantize_rows_kernel(bf16* x, int64_t ldx, uint8_t* q, int64_t ldq, float* scale,
                                         int64_t cols, bool write_back) {
  bf16* xr = x + blockIdx.x * ldx;
  uint8_t* qr = q + blockIdx.x * ldq;
  const int64_t step = VEC ? 8 : 1, n = cols / step;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if constexpr (VEC) {
      float v[8];
      bf16x8_unpack(reinterpret_cast<const uint4*>(xr)[i], v);
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
    } else {
      amax = fmaxf(amax, fabsf(__bfloat162float(xr[i])));
    }
  }
  amax = block_max(amax);
  float s = __fdiv_rn(amax, kE4m3Max);
  s = s > 0.0f ? s : 1.0f;  // core/fp8.h e4m3_scale
  if (threadIdx.x == 0) scale[blockIdx.x] = s;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if constexpr (VEC) {
      float v[8];
      bf16x8_unpack(reinterpret_cast<const uint4*>(xr)[i], v);
      uint2 codes;
      uint8_t* c = reinterpret_cast<uint8_t*>(&codes);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = f32_to_e4m3(__fdiv_rn(v[j], s));
        v[j] = e4m3_to_f32(c[j]) * s;
      }
      reinterpret_cast<uint2*>(qr)[i] = codes;
      if (write_back) reinterpret_cast<uint4*>(xr)[i] = bf16x8_pack(v);
    } else {
      const uint8_t code = f32_to_e4m3(__fdiv_rn(__bfloat162float(xr[i]), s));
      qr[i] = code;
      if (write_back) xr[i] = __float2bfloat16_rn(e4m3_to_f32(code) * s);
    }
  }
}

}  // namespace

void fp8_quantize_rows_launch(bf16* x, int64_t ldx, uint8_t* q, int64_t ldq, float* scale, int64_t rows,
                              int64_t cols, bool write_back, cudaStream_t stream) {
  if (rows == 0) return;
  DF_CHECK(rows <= 0x7fffffff, "fp8_quantize_rows: %lld rows exceed the grid", (long long)rows);
  const bool vec = cols % 8 == 0 && ldx % 8 == 0 && ldq % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0;
  if (vec)
    fp8_quantize_rows_kernel<true>
        <<<unsigned(rows), kQuantThreads, 0, stream>>>(x, ldx, q, ldq, scale, cols, write_back);
  else
    fp8_quantize_rows_kernel<false>
        <<<unsigned(rows), kQuantThreads, 0, stream>>>(x, ldx, q, ldq, scale, cols, write_back);
  DF_CUDA_CHECK_LAUNCH("fp8_quantize_rows_kernel");
}

}  // namespace df
