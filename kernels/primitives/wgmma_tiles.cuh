// Warpgroup operand tiles of 64 rows × 128 bf16 columns for wgmma (sm_90a): cp.async loads of gathered rows
// into the 128-byte swizzled layout (kernels/primitives/wgmma.cuh), and the m64n64 score and m64n128 accumulate products
// the DFlash attention kernels (kernels/attention/dflash_attention.cu, dflash_attention_kv.cu) issue from them, one
// warpgroup each.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/primitives/mma.cuh"
#include "kernels/primitives/wgmma.cuh"

namespace df {

// 16-byte cp.async to shared address `to`, zero-filled when !in (src must still be a valid address).
__device__ __forceinline__ void copy16(uint32_t to, const void* src, bool in) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src), "r"(in ? 16 : 0));
}

// One 64-row × 128-column bf16 operand tile in wgmma's 128-byte swizzled layout (kernels/primitives/wgmma.cuh).
constexpr int kWgTile = 64 * 128 * 2;

// Where 16-byte chunk ch of row r lies in consecutive 64-row wgmma tiles: 128-byte rows, 64-column halves a
// tile apart, chunks XOR-swizzled by the row.
__device__ __forceinline__ int wg_tile_offset(int r, int ch) {
  return (r >> 6) * kWgTile + (ch >> 3) * (64 * 128) + (r & 63) * 128 + (((ch & 7) ^ (r & 7)) << 4);
}

// Rows [0, ROWS) of an operand into consecutive 64-row wgmma tiles at dst (1024-byte aligned), row r read
// from src(r) (nullptr: a zero row), columns past hd zero (hd a multiple of 8, rows 16-byte aligned);
// cp.async copies by the THREADS threads of the block, complete at the next tile_wait_wg. The copies per
// thread are a constant, so the loop unrolls (its address arithmetic sits on the dk/dv kernel's critical
// path).
template <int ROWS, int THREADS, class Src>
__device__ __forceinline__ void load_tile_wg(unsigned char* dst, int hd, const __nv_bfloat16* any, Src src) {
  static_assert(ROWS * 16 % THREADS == 0, "whole rounds of 16-byte copies");
#pragma unroll
  for (int i = 0; i < ROWS * 16 / THREADS; ++i) {
    const int c = threadIdx.x + i * THREADS;
    const int r = c >> 4, ch = c & 15;  // row, 16-byte chunk of it
    const __nv_bfloat16* p = src(r);
    const bool in = p != nullptr && ch * 8 < hd;
    copy16(static_cast<uint32_t>(__cvta_generic_to_shared(dst + wg_tile_offset(r, ch))),
           in ? p + ch * 8 : any, in);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Where a row of two operands lies: row `row` (negative: a zero row), elements from `col`.
struct RowAt {
  int64_t row, col;
};

// Two operands whose rows share their indices (the dk/dv pass's Q and dO chunk) into wgmma tiles at dst_a and
// dst_b as load_tile_wg, the row arithmetic done once for both: src(r) gives row r's RowAt in a (row stride
// lda) and b (ldb).
template <int ROWS, int THREADS, class Src>
__device__ __forceinline__ void load_tile_pair_wg(unsigned char* dst_a, const __nv_bfloat16* a, int64_t lda,
                                                  unsigned char* dst_b, const __nv_bfloat16* b, int64_t ldb,
                                                  int hd, Src src) {
  static_assert(ROWS * 16 % THREADS == 0, "whole rounds of 16-byte copies");
#pragma unroll
  for (int i = 0; i < ROWS * 16 / THREADS; ++i) {
    const int c = threadIdx.x + i * THREADS;
    const int r = c >> 4, ch = c & 15;
    const RowAt at = src(r);
    const bool in = at.row >= 0 && ch * 8 < hd;
    const int64_t row = in ? at.row : 0, col = in ? at.col + ch * 8 : 0;
    const int to = wg_tile_offset(r, ch);
    copy16(static_cast<uint32_t>(__cvta_generic_to_shared(dst_a + to)), a + row * lda + col, in);
    copy16(static_cast<uint32_t>(__cvta_generic_to_shared(dst_b + to)), b + row * ldb + col, in);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// tile_wait for tiles the tensor cores read through the async proxy (wgmma): each thread orders its own
// cp.async writes before that proxy's reads, then the barrier publishes all of them.
__device__ __forceinline__ void tile_wait_wg() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  DF_SM90_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
}

// The first 1024-byte aligned byte of the dynamic shared memory (swizzled tiles need it): the same offset
// in every CTA of a launch, so distributed shared memory addresses still match across a cluster.
__device__ __forceinline__ unsigned char* align1024(unsigned char* p) {
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return p + (((raw + 1023u) & ~1023u) - raw);
}

// s = X·Yᵀ over HD columns for 64-row tiles X and Y (m64n64, both K-major), issued without commit. s[i]
// holds row 16·warp + g + 8·(i / 2 % 2), column 8·(i / 4) + 2·t4 + i % 2 (the m16n8 accumulator layout).
template <int HD>
__device__ __forceinline__ void wg_issue_abt(float (&s)[32], const unsigned char* x, const unsigned char* y) {
#ifdef DF_WGMMA_BODY
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) wgmma_ss<64>(s, wgmma_desc_k(x, kk), wgmma_desc_k(y, kk), kk > 0);
#endif
}

// One warpgroup's s = X·Yᵀ over 128 columns (wg_issue_abt) as one group, not waited for (wg_wait): the
// forward's scores.
__device__ __forceinline__ void wg_issue_score(float (&s)[32], const unsigned char* x,
                                               const unsigned char* y) {
#ifdef DF_WGMMA_BODY
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.0f;
  wgmma_fence();
  wg_issue_abt<128>(s, x, y);
  wgmma_commit();
#endif
}

// The two score-like products of a backward step, s = X·Yᵀ (S or Sᵀ) and t = Z·Wᵀ (dP or dPᵀ), as two groups,
// not waited for, so that P can be formed (wg_wait<1>) while dP is still on the tensor cores.
__device__ __forceinline__ void wg_issue_scores(float (&s)[32], const unsigned char* x, const unsigned char* y,
                                                float (&t)[32], const unsigned char* z, const unsigned char* w) {
#ifdef DF_WGMMA_BODY
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = t[i] = 0.0f;
  wgmma_fence();
  wg_issue_abt<128>(s, x, y);
  wgmma_commit();
  wg_issue_abt<128>(t, z, w);
  wgmma_commit();
#endif
}

// Waits until at most N of the warpgroup's groups are pending, then makes acc readable.
template <int N, int M>
__device__ __forceinline__ void wg_wait(float (&acc)[M]) {
#ifdef DF_WGMMA_BODY
  wgmma_wait<N>();
  wgmma_fence_regs(acc);
#endif
}

// A 64×64 accumulator rounded to bf16 as the register A operand of its four 16-column k-steps (each warp's
// 16 rows in the m16n8k16 A layout).
__device__ __forceinline__ void wg_a_frags(const float (&s)[32], uint32_t (&a)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    a[kk][0] = pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
    a[kk][1] = pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
    a[kk][2] = pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
    a[kk][3] = pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// acc += A·B, A 64 rows × 64 k (wg_a_frags), B the 64-row tile b read transposed (its rows are k): m64n128,
// waited for. acc[i] holds row 16·warp + g + 8·(i / 2 % 2), column 8·(i / 4) + 2·t4 + i % 2.
__device__ __forceinline__ void wg_product(float (&acc)[64], const uint32_t (&a)[4][4], const unsigned char* b) {
#ifdef DF_WGMMA_BODY
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_rs_tb<128>(acc, a[kk], wgmma_desc_t(b, kk));
  wgmma_commit();
  wgmma_wait_all();
  wgmma_fence_regs(acc);
#endif
}

// wg_product's issue alone, as one group, not waited for (acc and a stay untouched until a wg_wait).
__device__ __forceinline__ void wg_issue_product(float (&acc)[64], const uint32_t (&a)[4][4],
                                                 const unsigned char* b) {
#ifdef DF_WGMMA_BODY
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_rs_tb<128>(acc, a[kk], wgmma_desc_t(b, kk));
  wgmma_commit();
#endif
}

}  // namespace df
