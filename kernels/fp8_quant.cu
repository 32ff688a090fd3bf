// Row-wise e4m3 quantisation for the FP8 target (weights at load, each linear layer's input per token): the
// codes and f32 scales the FP8 GEMM (gemm.cuh gemm_fp8_launch) multiplies, bit-identical to the CPU oracle's
// CpuOps::fp8_round_rows: the same IEEE scale, reciprocal and product (core/fp8.h e4m3_quantize), rounded by
// the hardware's cvt.rn.satfinite.e4m3x2.f32, which tests/unit/test_fp8.cpp shows is core/fp8.h's rounding.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>

#include "core/fp8.h"
#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

namespace {

constexpr int kQuantThreads = 256;

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

// What a quantiser kernel reads as its bf16 rows. Chunk i of row r is its elements 8i .. 8i + 7 (load8: rows
// 16-byte aligned, cols a multiple of 8), element i one value (load1); back(r) is where code · scale goes
// (null: nowhere).
struct BfRows {  // x itself; with write_back x's rows become code · scale
  bf16* x;
  int64_t ld;
  bool write_back;
  __device__ uint4 load8(int64_t r, int64_t i) const { return reinterpret_cast<const uint4*>(x + r * ld)[i]; }
  __device__ float load1(int64_t r, int64_t i) const { return __bfloat162float(x[r * ld + i]); }
  __device__ bf16* back(int64_t r) const { return write_back ? x + r * ld : nullptr; }
};
struct SwigluRows {  // swiglu(gate, up) rounded to bf16 exactly as swiglu_launch stores it, never stored
  const bf16* g;
  int64_t ldg;
  const bf16* u;
  int64_t ldu;
  __device__ uint4 load8(int64_t r, int64_t i) const {
    float gv[8], uv[8];
    bf16x8_unpack(reinterpret_cast<const uint4*>(g + r * ldg)[i], gv);
    bf16x8_unpack(reinterpret_cast<const uint4*>(u + r * ldu)[i], uv);
#pragma unroll
    for (int j = 0; j < 8; ++j) gv[j] = swiglu_f32(gv[j], uv[j]);
    return bf16x8_pack(gv);
  }
  __device__ float load1(int64_t r, int64_t i) const {
    return bf16_rn(swiglu_f32(__bfloat162float(g[r * ldg + i]), __bfloat162float(u[r * ldu + i])));
  }
  __device__ bf16* back(int64_t) const {
    return nullptr;
  }
};

// One block per row, the row's chunks held in registers (R per thread, cols at most blockDim.x · 8 · R): the
// amax over them, then every chunk quantised from the same registers. Threads past the row's end load nothing
// and hold zeros, which leave the amax as it is.
template <class Src, int R>
__global__ void __launch_bounds__(kQuantThreads)
    fp8_quantize_rows_reg_kernel(Src src, uint8_t* q, int64_t ldq, float* scale, int64_t cols) {
  const int64_t row = blockIdx.x, n = cols / 8;
  uint4 raw[R];
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    raw[k] = i < n ? src.load8(row, i) : make_uint4(0, 0, 0, 0);
    amax = abs_max8(raw[k], amax);
  }
  const float s = row_scale(block_max(amax)), inv = ieee_rcp(s);
  if (threadIdx.x == 0) scale[row] = s;
  uint2* qr = reinterpret_cast<uint2*>(q + row * ldq);
  uint4* back = reinterpret_cast<uint4*>(src.back(row));
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i < n) qr[i] = quantize8(raw[k], inv, s, back ? back + i : nullptr);
  }
}

// Any row: the amax pass, then the quantise pass reading the row again (from cache: the first pass just
// brought it in). VEC: eight elements per step as above; otherwise one at a time (any alignment).
template <class Src, bool VEC>
__global__ void fp8_quantize_rows_kernel(Src src, uint8_t* q, int64_t ldq, float* scale, int64_t cols) {
  const int64_t row = blockIdx.x, n = VEC ? cols / 8 : cols;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if constexpr (VEC)
      amax = abs_max8(src.load8(row, i), amax);
    else
      amax = fmaxf(amax, fabsf(src.load1(row, i)));
  }
  const float s = row_scale(block_max(amax)), inv = ieee_rcp(s);
  if (threadIdx.x == 0) scale[row] = s;
  uint8_t* qr = q + row * ldq;
  bf16* back = src.back(row);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if constexpr (VEC) {
      uint4* b8 = back ? reinterpret_cast<uint4*>(back) + i : nullptr;
      reinterpret_cast<uint2*>(qr)[i] = quantize8(src.load8(row, i), inv, s, b8);
    } else {
      const uint32_t code = e4m3x2(src.load1(row, i), 0.0f, inv) & 0xffu;
      qr[i] = static_cast<uint8_t>(code);
      if (back) back[i] = __float2bfloat16_rn(e4m3x2_dequant(code, s).x);
    }
  }
}

template <class Src, int R>
void launch_reg(unsigned rows, int threads, const Src& src, uint8_t* q, int64_t ldq, float* scale,
                int64_t cols, cudaStream_t stream) {
  fp8_quantize_rows_reg_kernel<Src, R><<<rows, threads, 0, stream>>>(src, q, ldq, scale, cols);
}

// Rows of up to kQuantThreads · 8 · R elements stay in registers between the amax and the quantise pass (one
// read of the source); these R cover the Qwen widths with few idle slots (the 27B's 5120 and 6144 take R = 3,
// its down_proj's 17408 R = 9). Wider rows take the two-pass loop, whose second pass hits L2.
template <class Src>
struct RegVariant {
  int r;
  void (*launch)(unsigned, int, const Src&, uint8_t*, int64_t, float*, int64_t, cudaStream_t);
};
template <class Src>
constexpr RegVariant<Src> kRegVariants[] = {
    {1, launch_reg<Src, 1>}, {2, launch_reg<Src, 2>}, {3, launch_reg<Src, 3>},   {4, launch_reg<Src, 4>},
    {6, launch_reg<Src, 6>}, {9, launch_reg<Src, 9>}, {12, launch_reg<Src, 12>}, {16, launch_reg<Src, 16>}};

// vec: the source's rows allow 16-byte chunk loads (and q 8-byte stores).
template <class Src>
void quantize_rows_run(const Src& src, bool vec, uint8_t* q, int64_t ldq, float* scale, int64_t rows,
                       int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  DF_CHECK(rows <= 0x7fffffff, "fp8_quantize_rows: %lld rows exceed the grid", (long long)rows);
  vec = vec && cols % 8 == 0 && ldq % 8 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0;
  const int64_t chunks = cols / 8, per_thread = (chunks + kQuantThreads - 1) / kQuantThreads;
  const RegVariant<Src>* reg = nullptr;
  for (const RegVariant<Src>& v : kRegVariants<Src>)
    if (!reg && v.r >= per_thread) reg = &v;
  if (vec && chunks > 0 && reg) {
    // As few threads (whole warps) as hold the row at R chunks each, so only the last warp has idle slots.
    const int64_t need = (chunks + reg->r - 1) / reg->r;
    reg->launch(unsigned(rows), int((need + 31) / 32 * 32), src, q, ldq, scale, cols, stream);
  } else if (vec) {
    fp8_quantize_rows_kernel<Src, true>
        <<<unsigned(rows), kQuantThreads, 0, stream>>>(src, q, ldq, scale, cols);
  } else {
    fp8_quantize_rows_kernel<Src, false>
        <<<unsigned(rows), kQuantThreads, 0, stream>>>(src, q, ldq, scale, cols);
  }
  DF_CUDA_CHECK_LAUNCH("fp8_quantize_rows_kernel");
}

bool rows16(const void* p, int64_t ld) {  // 16-byte chunk loads: base and row pitch aligned
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % 8 == 0;
}

}  // namespace

void fp8_quantize_rows_launch(bf16* x, int64_t ldx, uint8_t* q, int64_t ldq, float* scale, int64_t rows,
                              int64_t cols, bool write_back, cudaStream_t stream) {
  quantize_rows_run(BfRows{x, ldx, write_back}, rows16(x, ldx), q, ldq, scale, rows, cols, stream);
}

void swiglu_fp8_launch(const bf16* gate, int64_t ld_gate, const bf16* up, int64_t ld_up, uint8_t* q,
                       int64_t ldq, float* scale, int64_t rows, int64_t cols, cudaStream_t stream) {
  quantize_rows_run(SwigluRows{gate, ld_gate, up, ld_up}, rows16(gate, ld_gate) && rows16(up, ld_up), q, ldq,
                    scale, rows, cols, stream);
}

}  // namespace df
