// Small device helpers shared by the kernel families: bf16 rounding that mirrors a torch bf16 op,
// SiLU/sigmoid in fp32, the attention epilogue's stores, vector bf16 loads/stores, and quad/warp/block sums
// and maxima.
#pragma once
#include <cuda_bf16.h>

#include <cmath>

namespace df {

// What storing an fp32 result into a bf16 tensor does (round to nearest even).
__device__ __forceinline__ float bf16_rn(float x) {
  return __bfloat162float(__float2bfloat16(x));
}

// Rounding policy of the inference kernels: a fused op computes in fp32 and rounds once, where its output is
// stored. HF's unfused bf16 ops round every intermediate tensor (Qwen3RMSNorm's x̂ before the weight,
// F.silu's output before the product with up, bf16 cos/sin and each RoPE term); the golden test bounds our
// error by HF-bf16's, and keeping those intermediates in fp32 is free inside a fused kernel.
//
// RMSNorm output from the normalised value x̂ = x·r, in fp32: (1 + w)·x̂ zero-centred, w·x̂ otherwise. The
// products are pinned (no contraction) so every kernel that calls this gets the same bits. One definition
// for the row and the per-head (QK) norms.
__device__ __forceinline__ float rmsnorm_apply(float x, float r, float w, bool zero_centred) {
  return __fmul_rn(__fmul_rn(x, r), zero_centred ? 1.0f + w : w);
}

__device__ __forceinline__ float sigmoid_f32(float x) {
  return 1.0f / (1.0f + __expf(-x));
}
__device__ __forceinline__ float silu_f32(float x) {
  return x * sigmoid_f32(x);
}
// One gated RMSNorm element (the DeltaNet output norm) before its store, from the value x, its row's r, the
// weight and the gate z: w·x̂·silu(z). The one expression gated_rmsnorm and the DeltaNet state kernel's fused
// epilogue use, so that with the same r they give the same bits.
__device__ __forceinline__ float gated_rmsnorm_apply(float x, float r, float w, float z) {
  return __fmul_rn(rmsnorm_apply(x, r, w, false), silu_f32(z));
}
// One SwiGLU element before its bf16 store: silu(gate) · up in fp32. Shared by swiglu and the FP8 quantiser
// that consumes it directly, so both see the same bits.
__device__ __forceinline__ float swiglu_f32(float g, float u) {
  return __fmul_rn(silu_f32(g), u);
}

// The gated-attention output gate on one element: o (already a bf16 value: the attention output as stored)
// times sigmoid(g) in fp32; the caller rounds the product. Shared by sigmoid_gate and the attention epilogues
// so the fused and separate paths give identical bits.
__device__ __forceinline__ float sigmoid_gate_f32(float o, float g) {
  return __fmul_rn(o, sigmoid_f32(g));
}

// Stores an attention output pair (a, b) at out, rounded to bf16; with a gate (non-null, 4-byte aligned)
// the rounded pair is then gated and rounded again, exactly as attention followed by sigmoid_gate.
// The same with the gate pair already loaded (kernels that issue a row's gate loads before any store).
__device__ __forceinline__ void attn_store_gated(__nv_bfloat16* out, __nv_bfloat162 g, float a, float b) {
  const __nv_bfloat162 r = __floats2bfloat162_rn(a, b);
  *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(
      sigmoid_gate_f32(__low2float(r), __low2float(g)), sigmoid_gate_f32(__high2float(r), __high2float(g)));
}

__device__ __forceinline__ void attn_store_pair(__nv_bfloat16* out, const __nv_bfloat16* gate, float a,
                                                float b) {
  if (gate)
    attn_store_gated(out, *reinterpret_cast<const __nv_bfloat162*>(gate), a, b);
  else
    *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(a, b);
}

// Sum over the four lanes of a quad (lanes 4g .. 4g + 3), which hold the columns of one row of an mma.sync
// accumulator (kernels/primitives/mma.cuh).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The flash-attention epilogue of one warp's 16 query rows, shared by attention.cu and attention_sm90.cu:
// rows row_a and row_a + 8 of the sequence whose tokens start at `start`, those below len, stored as o / l
// (l: this lane's part of the row sum) at head's hd columns of out, gated by the same place in gate when gate
// is non-null. o is the accumulator as HD / 8 n-tiles of m16n8 C fragments (kernels/primitives/mma.cuh: element e of
// tile c is row g + 8 (e >> 1), column 8c + 2t + (e & 1)); wgmma's m64 accumulator is the same per warp,
// tiles back to back. Columns from hd up (the tile's zero padding) are skipped.
template <int HD>
__device__ __forceinline__ void attn_store_rows(const float (&o)[HD / 8][4], const float (&l)[2],
                                                __nv_bfloat16* out, int64_t ld_out, const __nv_bfloat16* gate,
                                                int64_t ld_gate, int start, int len, int row_a, int head,
                                                int hd) {
  const int t4 = threadIdx.x & 3;
  const float inv_a = 1.0f / quad_sum(l[0]), inv_b = 1.0f / quad_sum(l[1]);
  // Each row's gate pairs are all loaded before its first store: the stores could alias the gate as far as
  // the compiler knows, so loads interleaved with them would each wait a full memory round trip.
  auto store_row = [&](__nv_bfloat16* dst, const __nv_bfloat16* gate_row, int lo, float inv) {
    if (gate_row) {
      __nv_bfloat162 gv[HD / 8];
#pragma unroll
      for (int c = 0; c < HD / 8; ++c) {
        const int d = 8 * c + 2 * t4;
        gv[c] = d < hd ? __ldg(reinterpret_cast<const __nv_bfloat162*>(gate_row + d)) : __nv_bfloat162{};
      }
#pragma unroll
      for (int c = 0; c < HD / 8; ++c) {
        const int d = 8 * c + 2 * t4;
        if (d < hd) attn_store_gated(dst + d, gv[c], o[c][lo] * inv, o[c][lo + 1] * inv);
      }
    } else {
#pragma unroll
      for (int c = 0; c < HD / 8; ++c) {
        const int d = 8 * c + 2 * t4;
        if (d < hd) attn_store_pair(dst + d, nullptr, o[c][lo] * inv, o[c][lo + 1] * inv);
      }
    }
  };
  __nv_bfloat16* out_a = out + (int64_t)(start + row_a) * ld_out + (int64_t)head * hd;
  const __nv_bfloat16* gate_a =
      gate ? gate + (int64_t)(start + row_a) * ld_gate + (int64_t)head * hd : nullptr;
  if (row_a < len) store_row(out_a, gate_a, 0, inv_a);
  if (row_a + 8 < len) store_row(out_a + 8 * ld_out, gate ? gate_a + 8 * ld_gate : nullptr, 2, inv_b);
}

// Eight bf16 held in one 16-byte register quad (what a uint4 load brings in) to and from fp32, for kernels
// that keep raw rows in registers between the load and the use.
__device__ __forceinline__ void bf16x8_unpack(const uint4& u, float (&v)[8]) {
  const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&u);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = __bfloat162float(e[j]);
}

__device__ __forceinline__ uint4 bf16x8_pack(const float (&v)[8]) {
  uint4 u;
  __nv_bfloat16* e = reinterpret_cast<__nv_bfloat16*>(&u);
#pragma unroll
  for (int j = 0; j < 8; ++j) e[j] = __float2bfloat16(v[j]);
  return u;
}

// Eight bf16 of a row (one 16-byte load) normalised with their eight fp32 weights (w8 16-byte aligned; the
// weights are shared by every row, so they stay in L1/L2), as eight fp32 values or packed back to bf16.
__device__ __forceinline__ void rmsnorm_apply8_f32(const uint4& raw, const float* w8, float r,
                                                   bool zero_centred, float (&v)[8]) {
  const float4 w0 = reinterpret_cast<const float4*>(w8)[0], w1 = reinterpret_cast<const float4*>(w8)[1];
  const float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
  bf16x8_unpack(raw, v);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = rmsnorm_apply(v[j], r, wv[j], zero_centred);
}

__device__ __forceinline__ uint4 rmsnorm_apply8(const uint4& raw, const float* w8, float r,
                                                bool zero_centred) {
  float v[8];
  rmsnorm_apply8_f32(raw, w8, r, zero_centred, v);
  return bf16x8_pack(v);
}

// V consecutive bf16 (V = 1, 2, 4 or 8) as the raw bits of one 2V-byte access, for kernels that put several
// rows' loads in flight before the first use: one register per 4 bytes instead of one per element.
template <int V>
struct Bf16Bits;
template <>
struct Bf16Bits<1> {
  using type = unsigned short;
};
template <>
struct Bf16Bits<2> {
  using type = unsigned int;
};
template <>
struct Bf16Bits<4> {
  using type = uint2;
};
template <>
struct Bf16Bits<8> {
  using type = uint4;
};
template <int V>
using bf16_bits_t = typename Bf16Bits<V>::type;

// The pointer must be aligned to 2V bytes.
template <int V>
__device__ __forceinline__ bf16_bits_t<V> load_bf16_bits(const __nv_bfloat16* p) {
  return *reinterpret_cast<const bf16_bits_t<V>*>(p);
}

template <int V>
__device__ __forceinline__ void unpack_bf16(const bf16_bits_t<V>& u, float (&v)[V]) {
  const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&u);
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = __bfloat162float(e[j]);
}

// V consecutive bf16 (load: V = 1, 2, 4 or 8; store: V = 1, 4 or 8; 2V-byte accesses, the pointer aligned
// to match) to and from fp32 registers.
template <int V>
__device__ __forceinline__ void load_bf16(const __nv_bfloat16* p, float (&v)[V]) {
  unpack_bf16<V>(load_bf16_bits<V>(p), v);
}

template <int V>
__device__ __forceinline__ void store_bf16(__nv_bfloat16* p, const float (&v)[V]) {
  if constexpr (V == 8) {
    *reinterpret_cast<uint4*>(p) = bf16x8_pack(v);
  } else if constexpr (V == 4) {
    uint2 u;
    __nv_bfloat16* e = reinterpret_cast<__nv_bfloat16*>(&u);
#pragma unroll
    for (int j = 0; j < 4; ++j) e[j] = __float2bfloat16(v[j]);
    *reinterpret_cast<uint2*>(p) = u;
  } else {
    *p = __float2bfloat16(v[0]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The whole block's reduction by WARP (warp_sum or warp_max; blockDim.x a multiple of 32, ≤ 1024), identity
// standing in past the block's warps; every thread gets the result.
template <float (*WARP)(float)>
__device__ __forceinline__ float block_reduce(float v, float identity) {
  __shared__ float partial[32];
  v = WARP(v);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  int nw = blockDim.x >> 5;
  float t = lane < nw ? partial[lane] : identity;
  return WARP(t);
}

// Sum over the whole block; every thread gets the result.
__device__ __forceinline__ float block_sum(float v) { return block_reduce<warp_sum>(v, 0.0f); }

// Max over the whole block (−inf from a block of −inf); every thread gets the result.
__device__ __forceinline__ float block_max(float v) { return block_reduce<warp_max>(v, -INFINITY); }

}  // namespace df
