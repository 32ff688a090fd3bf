// Warp-level tensor-core wrappers (mma.sync, ldmatrix) and the cp.async copies that feed them, shared by the
// attention, DFlash attention, decode and Gated DeltaNet kernels.
// Fragment layouts (PTX ISA, g = lane / 4, t = lane % 4): C/D of m16n8 holds (g, 2t), (g, 2t+1), (g+8, 2t),
// (g+8, 2t+1); bf16 m16n8k16 A holds (g, 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..), B (k 2t.., n g),
// (k 2t+8.., n g).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

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

// The transpose of an 8×8 bf16 matrix held as the fragment above (lane (g, t): row g, columns 2t, 2t+1): the
// result is the same fragment of the transposed matrix, i.e. lane (g, t) gets (rows 2t, 2t+1, column g).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
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

// One warp, shared-memory tiles of bf16 rows (row stride LDS elements, a multiple of 8):
// The ldmatrix.trans walk over B (16 k rows, row-major [k][n] at `b`) shared by the A·B products below: for
// each pair of 8-column n-tiles, mma(acc_lo, acc_hi, f) with f the pair's two B fragments.
template <int NT, int LDS, class Mma>
__device__ __forceinline__ void warp_mma_ab_walk(float (&acc)[NT][4], const __nv_bfloat16* b, int lane, Mma mma) {
  const int mat = lane >> 3, r8 = lane & 7;
  const __nv_bfloat16* base = b + ((mat & 1) * 8 + r8) * LDS + (mat >> 1) * 8;
#pragma unroll
  for (int nd = 0; nd < NT / 2; ++nd) {
    uint32_t f[4];
    ldmatrix_x4_trans(f, base + nd * 16);
    mma(acc[2 * nd], acc[2 * nd + 1], f);
  }
}

// acc[16 rows × 8·NT cols] += A · B with A's 16×16 k-slice given as mma A fragments and B (16 k rows,
// row-major [k][n] at `b`) read with ldmatrix.trans: attention's P·V step.
template <int NT, int LDS>
__device__ __forceinline__ void warp_mma_ab(float (&acc)[NT][4], const uint32_t (&a)[4], const __nv_bfloat16* b,
                                            int lane) {
  warp_mma_ab_walk<NT, LDS>(acc, b, lane, [&](float (&lo)[4], float (&hi)[4], const uint32_t (&f)[4]) {
    mma_bf16_16816(lo, a[0], a[1], a[2], a[3], f[0], f[1]);
    mma_bf16_16816(hi, a[0], a[1], a[2], a[3], f[2], f[3]);
  });
}

// s[16 rows × 8·NT] = X · Yᵀ over HD columns, X rows at x (16 of them), Y rows at y (8·NT), both [row][d]:
// attention's Q·Kᵀ step.
template <int NT, int HD, int LDS>
__device__ __forceinline__ void warp_mma_abt(float (&s)[NT][4], const __nv_bfloat16* x, const __nv_bfloat16* y,
                                             int lane) {
  const int mat = lane >> 3, r8 = lane & 7;
  const __nv_bfloat16* xf = x + ((mat & 1) * 8 + r8) * LDS + (mat >> 1) * 8;
  const __nv_bfloat16* yf = y + ((mat >> 1) * 8 + r8) * LDS + (mat & 1) * 8;
#pragma unroll
  for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, xf + kk * 16);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, yf + np * 16 * LDS + kk * 16);
      mma_bf16_16816(s[2 * np], a[0], a[1], a[2], a[3], b[0], b[1]);
      mma_bf16_16816(s[2 * np + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
    }
  }
}

// The accumulator of a 16×16 product, rounded to bf16, as the A fragment of the next MMA (k = its columns).
__device__ __forceinline__ void acc_to_a_frag(const float (&lo)[4], const float (&hi)[4], uint32_t (&a)[4]) {
  a[0] = pack_bf16x2(lo[0], lo[1]);
  a[1] = pack_bf16x2(lo[2], lo[3]);
  a[2] = pack_bf16x2(hi[0], hi[1]);
  a[3] = pack_bf16x2(hi[2], hi[3]);
}

// The same fragment kept to 16 mantissa bits: each pair split into bf16 hi + lo (split_bf16x2), for an fp32
// accumulator that feeds the next product through mma_split_a.
__device__ __forceinline__ void acc_to_a_frag_split(const float (&c0)[4], const float (&c1)[4],
                                                    uint32_t (&ah)[4], uint32_t (&al)[4]) {
  split_bf16x2(c0[0], c0[1], ah[0], al[0]);
  split_bf16x2(c0[2], c0[3], ah[1], al[1]);
  split_bf16x2(c1[0], c1[1], ah[2], al[2]);
  split_bf16x2(c1[2], c1[3], ah[3], al[3]);
}

// acc0 += (A_hi + A_lo)·B(b[0], b[1]) and acc1 += (A_hi + A_lo)·B(b[2], b[3]): the two 8-column tiles of one
// ldmatrix_x4 against an A split into bf16 hi + lo, hi first into each accumulator.
__device__ __forceinline__ void mma_split_a(float (&acc0)[4], float (&acc1)[4], const uint32_t (&ah)[4],
                                            const uint32_t (&al)[4], const uint32_t (&b)[4]) {
  mma_bf16_16816(acc0, ah[0], ah[1], ah[2], ah[3], b[0], b[1]);
  mma_bf16_16816(acc0, al[0], al[1], al[2], al[3], b[0], b[1]);
  mma_bf16_16816(acc1, ah[0], ah[1], ah[2], ah[3], b[2], b[3]);
  mma_bf16_16816(acc1, al[0], al[1], al[2], al[3], b[2], b[3]);
}

// warp_mma_ab with A split into bf16 hi + lo (acc_to_a_frag_split): P·V where P must keep 16 mantissa
// bits, as the decode attention whose softmax weights stay fp32 up to the output rounding.
template <int NT, int LDS>
__device__ __forceinline__ void warp_mma_ab_split(float (&acc)[NT][4], const uint32_t (&ah)[4],
                                                  const uint32_t (&al)[4], const __nv_bfloat16* b, int lane) {
  warp_mma_ab_walk<NT, LDS>(acc, b, lane, [&](float (&lo)[4], float (&hi)[4], const uint32_t (&f)[4]) {
    mma_split_a(lo, hi, ah, al, f);
  });
}

// The online softmax's rescale of an m16 accumulator: rows g by c_lo, rows g + 8 by c_hi.
template <int NT>
__device__ __forceinline__ void scale_acc_rows(float (&acc)[NT][4], float c_lo, float c_hi) {
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    acc[i][0] *= c_lo;
    acc[i][1] *= c_lo;
    acc[i][2] *= c_hi;
    acc[i][3] *= c_hi;
  }
}

// Barrier `id` (1..15; 0 is __syncthreads') over `threads` threads, a multiple of 32: the warps of one group
// wait for each other, with shared memory ordered as by __syncthreads, while the rest of the CTA runs on.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// 16 bytes global → shared without a register stage; bytes < 16 zero-fills the rest (0: a zero chunk, src
// still a valid address). Copies of one thread complete in commit order: cp_async_wait<N> leaves at most N
// of its groups in flight.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int bytes) {
  const uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Host side: calls fn(std::integral_constant<int, P>{}) with P the smallest power of two from Min up that is at
// least n, or Max when n is above Max: the dispatch from a runtime size to the template sizes a kernel is built
// for.
template <int Min, int Max, class Fn>
void dispatch_pow2(int n, Fn&& fn) {
  if constexpr (Min >= Max)
    fn(std::integral_constant<int, Max>{});
  else if (n <= Min)
    fn(std::integral_constant<int, Min>{});
  else
    dispatch_pow2<2 * Min, Max>(n, fn);
}

// The head dim rounded up to the template sizes (16, 32, 64, 128, 256) of the kernels above, whose
// shared-memory rows are zero-padded to HD.
template <class Fn>
void dispatch_head_dim(int hd, Fn&& fn) {
  dispatch_pow2<16, 256>(hd, fn);
}

}  // namespace df
