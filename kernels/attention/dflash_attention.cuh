// What the two DFlash attention files share (kernels/attention/dflash_attention.cu: the query-major forward and dq pass,
// and the launchers; kernels/attention/dflash_attention_kv.cu: the key-major dk/dv pass): the block mask, the tile copies
// and stores, and the dk/dv pass's arguments and entry point. Internal to those two files.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/mma.cuh"
#include "kernels/primitives/tma.cuh"
#include "kernels/primitives/wgmma_tiles.cuh"
#include "kernels/train_launchers.cuh"

namespace df {
namespace dfa {

constexpr int kTile = 64;  // keys per K/V tile of the query-major passes, query rows per CTA or chunk
// What a small form (dflash_attention_form_choose) may ask at most: the opt-in shared memory a block has on
// sm_120 (RTX PRO 6000, RTX 50) and sm_89 (Ada), the smallest of the GPUs the portable kernels serve.
constexpr size_t kSmallSmem = 101376;
constexpr float kLog2e = 1.4426950408889634f;

// ---- kernels ----------------------------------------------------------------------------------------

// One block's mask (train_ops.h) on absolute k/v rows: context rows [s0 + lo(kq), s0 + a), own rows
// [bj, bj + B), causal in sliding layers. Context rows end at s0 + a ≤ T ≤ bj, so the two ranges never meet.
struct BlockMask {
  int64_t s0, a, bj;
  int B, W;
  __device__ int64_t lo(int kq) const { return W > 0 ? min(a, max(int64_t(0), a + kq - (W - 1))) : 0; }
  // Whether some query row of the block sees a k/v row in [k0, k1) (lo grows with kq: lo(0) is the least).
  __device__ bool sees(int64_t k0, int64_t k1) const {
    return (s0 + lo(0) < k1 && s0 + a > k0) || (bj < k1 && bj + B > k0);
  }
};

__device__ __forceinline__ BlockMask block_mask(const int32_t* blocks, int64_t j, const DFlashAttnDims& d) {
  return {blocks[2 * j], blocks[2 * j + 1], d.T + j * d.block, d.block, d.window};
}

// Rows [0, ROWS) of a tile into shared memory (row stride HD + 8: the 8 rows of an ldmatrix hit 8 bank
// groups), row r read from src(r) (nullptr: a zero row), columns past hd zero. vec: 16-byte cp.async copies,
// complete at the next tile_wait; otherwise element copies (any hd, stride or alignment).
template <int HD, int ROWS, int THREADS, class Src>
__device__ __forceinline__ void load_tile(bf16* dst, int hd, bool vec, const bf16* any, Src src) {
  constexpr int LDS = HD + 8;
  if (vec) {
    constexpr int kChunks = HD / 8;
    for (int c = threadIdx.x; c < ROWS * kChunks; c += THREADS) {
      const int r = c / kChunks, d = (c % kChunks) * 8;
      const bf16* p = src(r);
      const bool in = p != nullptr && d < hd;
      copy16(static_cast<uint32_t>(__cvta_generic_to_shared(dst + r * LDS + d)), in ? p + d : any, in);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  } else {
    for (int c = threadIdx.x; c < ROWS * HD; c += THREADS) {
      const int r = c / HD, d = c % HD;
      const bf16* p = src(r);
      dst[r * LDS + d] = p != nullptr && d < hd ? p[d] : __float2bfloat16(0.0f);
    }
  }
}

// (rr / block, rr % block) for a query row rr ≥ 0 of a block's GQA group (head, token), without a division
// or a branch: magic = ⌊(2^64 − 1) / block⌋ + 1 (block_magic) exceeds 2^64 / block by e < block, so the
// 64-bit multiply-high is off by rr·e / 2^64 < 1 / block and rounds to the exact quotient for every 32-bit
// rr; block 1 (whose magic would be 2^64) passes magic 0.
__device__ __forceinline__ int2 row_split(int rr, int block, uint64_t magic) {
  const int h = magic ? int(__umul64hi(uint64_t(uint32_t(rr)), magic)) : rr;
  return make_int2(h, rr - h * block);
}

// Every copy of this thread is done; the barrier makes all of them (and the element stores) visible.
__device__ __forceinline__ void tile_wait() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
}

// Two adjacent output columns d, d + 1 of one row (either may lie past hd).
__device__ __forceinline__ void store_two(bf16* row, int d, int hd, bool pairs, float x0, float x1) {
  if (pairs && d + 1 < hd) {
    *reinterpret_cast<__nv_bfloat162*>(row + d) = __floats2bfloat162_rn(x0, x1);
  } else {
    if (d < hd) row[d] = __float2bfloat16(x0);
    if (d + 1 < hd) row[d + 1] = __float2bfloat16(x1);
  }
}
struct KvArgs {
  const bf16 *q, *k, *v, *dout;
  int64_t ld_q, ld_k, ld_v, ld_dout;
  const int32_t* blocks;
  const float *lse2, *dsum;  // dfa_rowterms_kernel's layout
  bf16 *dk, *dv;
  int64_t ld_dk, ld_dv;
  DFlashAttnDims d;
  float scale_log2;
  bool vec, pairs;
  uint64_t blk_magic;  // row_split's magic for d.block
  bool tma;            // the wgmma kernel streams Q and dO by TMA (a group of at most 64 query rows)
  int64_t rows;        // the k/v rows this pass writes: all, or the context rows [0, T) when the dq pass
                       // writes the own rows (QueryArgs::own_kv)
  int head_group;      // 0: the grid is (key tile, kv head); n > 0 (dividing hkv): (kv head of a group of n,
                       // key tile, group), each tile's heads of a group together (dfa_kv_kernel)
  bool overlap;        // the dq pass is launched after this one and may start in its tail (pdl.cuh)
};

// row_split's multiplier for block > 0 (0 for block 1).
inline uint64_t block_magic(int block) {
  return block > 1 ? ~uint64_t(0) / uint64_t(block) + 1u : 0u;
}

// The key-major dk/dv pass over k/v rows [0, a.rows) (dflash_attention_kv.cu): the wgmma kernel when wg,
// else the mma.sync kernel of the head dim's padded width.
void kv_pass_launch(const KvArgs& a, bool wg, cudaStream_t stream);

}  // namespace dfa
}  // namespace df
