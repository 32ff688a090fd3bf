// Warp-level tensor-core wrappers (mma.sync, ldmatrix) shared by the attention and Gated DeltaNet kernels.
// Fragment layouts (PTX ISA, g = lane / 4, t = lane % 4): C/D of m16n8 holds (g, 2t), (g, 2t+1), (g+8, 2t),
// (g+8, 2t+1); bf16 m16n8k16 A holds (g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..), B (k 2t.., n g),
// (k 2t+8.., n g).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace df {

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four 8×8 bf16 matrices; lanes 8i..8i+7 give the row addresses of matrix i. Without .trans lane (g, t) gets
// (row g, columns 2t, 2t+1) of each, with .trans (rows 2t, 2t+1, column g).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// x ≈ hi + lo with both halves bf16 (16 mantissa bits together): two bf16 MMAs on (hi, lo) give an fp32
// operand more precision than TF32, for the operands that are fp32 (state, V', T) rather than bf16 data.
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  float2 hf = __bfloat1622float2(h);
  __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
  hi = *reinterpret_cast<uint32_t*>(&h);
  lo = *reinterpret_cast<uint32_t*>(&l);
}

}  // namespace df
