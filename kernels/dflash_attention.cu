// DFlash block attention (train_ops.h DFlashAttnShape, MODELS.md) forward and backward on bf16 tensor cores
// (mma.sync m16n8k16, fp32 accumulation and softmax). One CTA per (block, kv head, 64 rows of the GQA group's
// hq/hkv·B query rows) walks only the visible keys: the context range [s0 + lo, s0 + a) then the B own rows.
// Backward, deterministic without atomics: row terms lse·log2 e and D = rowsum(dO∘O); dq query-major (the
// forward's walk); dk/dv key-major, a cluster of CTAs per (key tile, kv head) sharing, in block order, the
// blocks that see the tile, their fp32 partials summed in a fixed order through distributed shared memory.
// On Hopper at head dims 65..128 the three passes run the same walks on wgmma (one warpgroup per 64 query rows
// or 64 keys, operands straight from swizzled shared memory); DFLASH_DFA=mma keeps the mma.sync kernels.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda_check.cuh"
#include "kernels/launchers.cuh"
#include "kernels/mma.cuh"
#include "kernels/train_launchers.cuh"
#include "kernels/wgmma_tiles.cuh"

namespace df {

namespace {

constexpr int kTile = 64;  // keys per K/V tile of the query-major passes, query rows per CTA or chunk
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

// One key tile of the forward's online softmax for this thread's two query rows: NT n-tiles of masked scores
// in the exp2 domain (−inf where masked; element e of n-tile n is S(n, e), of row e / 2) become unnormalised
// weights against the rows' new running max; mx_run and l move on; corr[h] rescales what row h holds so far.
template <int NT, class Sf>
__device__ __forceinline__ void softmax_step(Sf&& S, float (&mx_run)[2], float (&l)[2], float (&corr)[2]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], S(n, e));
  float base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float m_new = fmaxf(mx_run[h], mx[h]);
    base[h] = m_new == -INFINITY ? 0.0f : m_new;  // a row that has seen nothing yet keeps 0 weight
    corr[h] = exp2f(mx_run[h] - base[h]);
    mx_run[h] = m_new;
    l[h] *= corr[h];
  }
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      S(n, e) = exp2f(S(n, e) - base[e >> 1]);
      l[e >> 1] += S(n, e);
    }
}

struct QueryArgs {
  const bf16 *q, *k, *v, *dout;
  int64_t ld_q, ld_k, ld_v, ld_dout;
  const int32_t* blocks;
  const float *lse2, *dsum;  // dq pass: lse·log2 e and D = rowsum(dO∘O), dfa_rowterms_kernel's layout
  bf16* o;                   // out (forward) or dq
  int64_t ld_o;
  float* lse_out;  // forward
  int64_t ld_lse;
  DFlashAttnDims d;
  float scale_log2;
  bool vec, pairs;
};

// Query-major pass over one CTA's 64 query rows. Forward (DQ false): online softmax, out and lse. DQ: P from
// the saved lse, dS = P∘(dO·Vᵀ − D), dq = scale·dS·K. Key tile i of the walk holds virtual keys
// [64i, 64i + 64): virtual key x < nctx is context row c0 + x, the rest own rows; every query row sees one
// interval [ilo, ihi) of virtual keys, so the mask is two compares. WG (hd 128 only): the 4 warps are one
// warpgroup running the products on wgmma from swizzled tiles (P or dS as the register operand); two CTAs
// fit an SM.
template <int HD, bool DQ, bool WG>
__global__ void __launch_bounds__(128, WG ? 2 : 1) dfa_query_kernel(QueryArgs p) {
  static_assert(!WG || HD == 128, "the wgmma variant is written for head dim 128");
  constexpr int LDS = HD + 8;
  constexpr int KSUB = DQ && HD > 128 ? 32 : 64;  // keys per step: S and dP of 64 keys would spill at hd 256
  constexpr int TILE = WG ? kWgTile : int(sizeof(bf16)) * kTile * LDS;  // bytes of one 64-row tile
  extern __shared__ __align__(16) unsigned char dfa_smem[];
  unsigned char* const Qt = WG ? align1024(dfa_smem) : dfa_smem;
  unsigned char* const dOt = Qt + TILE;                 // DQ only
  unsigned char* const KV = Qt + (DQ ? 2 : 1) * TILE;  // K, V of two tiles: the next one loads during this one
  auto Kb = [&](int b) { return KV + 2 * b * TILE; };
  auto Vb = [&](int b) { return KV + (2 * b + 1) * TILE; };
  const DFlashAttnDims& d = p.d;
  // The drafter's anchors ascend within a sequence, so the last blocks see the most keys: the wgmma variant
  // walks the blocks from the last, which starts the longest CTAs first and leaves short ones for the tail.
  const int64_t j = WG ? d.nb - 1 - blockIdx.x : blockIdx.x;
  const int g = blockIdx.y, group = d.hq / d.hkv, R = group * d.block, z0 = blockIdx.z * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, gr = lane >> 2, t4 = lane & 3;
  const BlockMask m = block_mask(p.blocks, j, d);
  auto q_row = [&](int r) { return j * d.block + r % d.block; };  // r: row of the group, < R
  auto q_col = [&](int r) { return int64_t(g * group + r / d.block) * d.hd; };

  if (m.a < 0) {  // padding block: out / dq 0, lse −inf
    for (int c = threadIdx.x; c < kTile * d.hd; c += blockDim.x) {
      const int r = z0 + c / d.hd, e = c % d.hd;
      if (r >= R) continue;
      p.o[q_row(r) * p.ld_o + q_col(r) + e] = __float2bfloat16(0.0f);
      if (!DQ && e == 0) p.lse_out[q_row(r) * p.ld_lse + g * group + r / d.block] = -INFINITY;
    }
    return;
  }
  const int64_t lo0 = m.lo(0), nctx = m.a - lo0, c0 = m.s0 + lo0;
  const int nkeys = int(nctx) + d.block;
  auto key_row = [&](int x) { return x < nctx ? c0 + x : m.bj + (x - nctx); };

  auto qsrc = [&](const bf16* base, int64_t ld) {
    return [=](int r) -> const bf16* {
      return z0 + r < R ? base + q_row(z0 + r) * ld + q_col(z0 + r) : nullptr;
    };
  };
  auto kvsrc = [&](const bf16* base, int64_t ld, int k0) {
    return [=](int r) -> const bf16* {
      return k0 + r < nkeys ? base + key_row(k0 + r) * ld + int64_t(g) * d.hd : nullptr;
    };
  };
  auto load = [&](unsigned char* dst, auto src) {
    if constexpr (WG)
      load_tile_wg<kTile, 128>(dst, d.hd, p.q, src);
    else
      load_tile<HD, kTile, 128>(reinterpret_cast<bf16*>(dst), d.hd, p.vec, p.q, src);
  };
  load(Qt, qsrc(p.q, p.ld_q));
  if (DQ) load(dOt, qsrc(p.dout, p.ld_dout));
  load(Kb(0), kvsrc(p.k, p.ld_k, 0));
  load(Vb(0), kvsrc(p.v, p.ld_v, 0));

  // The two query rows this thread holds, their visible interval and (dq) their lse and D.
  int ilo[2], ihi[2];
  float lse2[2] = {0.0f, 0.0f}, dsum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = z0 + warp * 16 + gr + 8 * h, kq = r % d.block;
    ilo[h] = r < R ? int(m.lo(kq) - lo0) : 0;
    ihi[h] = r < R ? int(nctx) + (d.window > 0 ? kq + 1 : d.block) : 0;
    if (DQ && r < R) {
      const int64_t at = (j * d.hq + int64_t(g) * group) * d.block + r;
      lse2[h] = p.lse2[at];
      dsum[h] = p.dsum[at];
    }
  }

  // Output accumulator: per warp 16 rows × HD, as mma.sync n-tiles or as the wgmma m64n128 fragment (the
  // same element order: o[i] of the flat one is o[i / 4][i % 4]).
  std::conditional_t<WG, float[64], float[HD / 8][4]> o;
  if constexpr (WG) {
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  } else {
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  }
  float mx_run[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const bf16* qw = reinterpret_cast<const bf16*>(Qt) + warp * 16 * LDS;
  const bf16* dOs = reinterpret_cast<const bf16*>(dOt);

  for (int k0 = 0, buf = 0; k0 < nkeys; k0 += kTile, buf ^= 1) {
    // Tile k0 landed; every warp is done with the other buffer (tile k0 − 64).
    if constexpr (WG)
      tile_wait_wg();
    else
      tile_wait();
    if (k0 + kTile < nkeys) {
      load(Kb(buf ^ 1), kvsrc(p.k, p.ld_k, k0 + kTile));
      load(Vb(buf ^ 1), kvsrc(p.v, p.ld_v, k0 + kTile));
    }
    if constexpr (WG && !DQ) {
      // The mma.sync step on the wgmma fragment: masked scores, the online softmax, o += P·V.
      float s[32];
      wg_score(s, Qt, Kb(buf));
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int x = k0 + 8 * (i >> 2) + 2 * t4 + (i & 1), h = (i >> 1) & 1;
        s[i] = x >= ilo[h] && x < ihi[h] ? s[i] * p.scale_log2 : -INFINITY;
      }
      float corr[2];
      softmax_step<8>([&](int n, int e) -> float& { return s[4 * n + e]; }, mx_run, l, corr);
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] *= corr[(i >> 1) & 1];
      uint32_t a[4][4];
      wg_a_frags(s, a);
      wg_product(o, a, Vb(buf));
    } else if constexpr (WG) {
      // dS = P∘(dP − D) for this thread's 32 (query, key) pairs, masked pairs 0, then dq += dS·K; P is formed
      // while dP is still on the tensor cores.
      float s[32], dp[32];
      wg_issue_scores(s, Qt, Kb(buf), dp, dOt, Vb(buf));
      wg_wait<1>(s);
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int x = k0 + 8 * (i >> 2) + 2 * t4 + (i & 1), h = (i >> 1) & 1;
        s[i] = x >= ilo[h] && x < ihi[h] ? exp2f(s[i] * p.scale_log2 - lse2[h]) : 0.0f;
      }
      wg_wait<0>(dp);
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] *= dp[i] - dsum[(i >> 1) & 1];
      uint32_t a[4][4];
      wg_a_frags(s, a);
      wg_product(o, a, Kb(buf));
    } else {
      const bf16 *Ks = reinterpret_cast<const bf16*>(Kb(buf)), *Vs = reinterpret_cast<const bf16*>(Vb(buf));
      for (int kh = 0; kh < kTile && k0 + kh < nkeys; kh += KSUB) {
        float s[KSUB / 8][4];
        warp_mma_abt<KSUB / 8, HD, LDS>(s, qw, Ks + kh * LDS, lane);
#pragma unroll
        for (int n = 0; n < KSUB / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int x = k0 + kh + n * 8 + 2 * t4 + (e & 1), h = e >> 1;
            s[n][e] = x >= ilo[h] && x < ihi[h] ? s[n][e] * p.scale_log2 : -INFINITY;
          }
        if constexpr (!DQ) {
          float corr[2];
          softmax_step<KSUB / 8>([&](int n, int e) -> float& { return s[n][e]; }, mx_run, l, corr);
          scale_acc_rows(o, corr[0], corr[1]);
        } else {
          float dp[KSUB / 8][4];
          warp_mma_abt<KSUB / 8, HD, LDS>(dp, dOs + warp * 16 * LDS, Vs + kh * LDS, lane);
#pragma unroll
          for (int n = 0; n < KSUB / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int h = e >> 1;
              s[n][e] = exp2f(s[n][e] - lse2[h]) * (dp[n][e] - dsum[h]);
            }
        }
        // o += P·V (forward) or dS·K (dq), 16 keys per k-step.
#pragma unroll
        for (int kk = 0; kk < KSUB / 16; ++kk) {
          uint32_t a[4];
          acc_to_a_frag(s[2 * kk], s[2 * kk + 1], a);
          warp_mma_ab<HD / 8, LDS>(o, a, (DQ ? Ks : Vs) + (kh + kk * 16) * LDS, lane);
        }
      }
    }
  }

  float fin[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!DQ) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    fin[h] = DQ ? d.scale : 1.0f / l[h];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = z0 + warp * 16 + gr + 8 * h;
    if (r >= R) continue;
    bf16* orow = p.o + q_row(r) * p.ld_o + q_col(r);
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) {
      float x0, x1;
      if constexpr (WG)
        x0 = o[4 * i + 2 * h], x1 = o[4 * i + 2 * h + 1];
      else
        x0 = o[i][2 * h], x1 = o[i][2 * h + 1];
      store_two(orow, i * 8 + 2 * t4, d.hd, p.pairs, x0 * fin[h], x1 * fin[h]);
    }
    if (!DQ && t4 == 0)  // natural-log lse of the scaled scores: (max + log2 Σ) / log2 e
      p.lse_out[q_row(r) * p.ld_lse + g * group + r / d.block] = (mx_run[h] + log2f(l[h])) / kLog2e;
  }
}

// The softmax row terms of the backward, one warp per (row, head), laid out [block][q head][block row] so
// that a query chunk of the GQA group (rows (head − g·group)·B + kq) is contiguous: lse2 = lse·log2 e (the
// exp2 domain of the passes) and D = Σ_d dO·O in fp32.
__global__ void dfa_rowterms_kernel(const bf16* out, int64_t ld_out, const bf16* dout, int64_t ld_dout,
                                    const float* lse, int64_t ld_lse, float* lse2, float* dsum, int64_t rows,
                                    int hq, int hd, int block) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (w >= rows * hq) return;
  const int64_t r = w / hq, head = w % hq, col = head * hd;
  float acc = 0.0f;
  for (int e = lane; e < hd; e += 32)
    acc += __bfloat162float(out[r * ld_out + col + e]) * __bfloat162float(dout[r * ld_dout + col + e]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane != 0) return;
  const int64_t at = (r / block * hq + head) * block + r % block;
  dsum[at] = acc;
  lse2[at] = lse[r * ld_lse + head] * kLog2e;
}

// 4-byte cp.async (zero-filled when !in), complete at the next tile_wait.
__device__ __forceinline__ void copy4(float* dst, const float* src, bool in) {
  const uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(to), "l"(src), "r"(in ? 4 : 0));
}

// Key-major dk/dv, 8 warps, each on 16 keys of the CTA's tile: 128 keys at hd ≤ 128; at hd 256 the tile is
// 64 keys and warp pairs split the head columns of dk/dv (128 accumulator columns of each per thread at most,
// so nothing spills).
template <int HD>
struct KvCfg {
  static constexpr int kSplit = HD > 128 ? 2 : 1;
  static constexpr int kThreads = 256;
  static constexpr int kKeys = 128 / kSplit;
  static constexpr int kCols = HD / kSplit;
  static constexpr int kQStep = HD > 128 ? 16 : 32;  // query rows per step of a warp (32 spills at hd 256)
  static constexpr int kScanK = 4;                   // blocks each thread tests per round of the scan
  static constexpr int kRanks = 4;                   // CTAs of a cluster sharing one tile's items
  static constexpr size_t kPartBytes = sizeof(float) * 2 * kKeys * HD;  // one rank's dk, dv partial
};

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
};

// One cluster of kRanks CTAs per (kKeys absolute k/v rows, kv head). Each CTA lists, in block order, the
// blocks that see any of its keys (kScanK·THREADS entries of `blocks` at a time, their masks kept in shared
// memory); of the list's items (block, 64-row query chunk) rank r takes the r-th contiguous share, so a tile
// that every block sees (the start of a long context) is spread over kRanks SMs. Per item it loads the
// group's query rows with their row terms (the next item's copies fly during this one): Sᵀ = K·Qᵀ, Pᵀ from
// the lse, dV += Pᵀ·dO, dSᵀ = Pᵀ∘(V·dOᵀ − D), dK += dSᵀ·Q. The ranks' f32 partials are then summed through
// distributed shared memory in rank order and each dk/dv row written once: deterministic, no atomics.
// WG (hd 128 only): each warpgroup owns 64 of the 128 keys and runs the four products of an item on wgmma
// (Sᵀ and dPᵀ from swizzled tiles, Pᵀ and dSᵀ as register operands).
template <int HD, bool WG>
__global__ void __launch_bounds__(KvCfg<HD>::kThreads, 1) __cluster_dims__(1, 1, KvCfg<HD>::kRanks)
    dfa_kv_kernel(KvArgs p) {
  using Cfg = KvCfg<HD>;
  static_assert(!WG || (HD == 128 && Cfg::kKeys == 128 && Cfg::kThreads == 256),
                "the wgmma variant: head dim 128, two warpgroups of 64 keys");
  constexpr int LDS = HD + 8, THREADS = Cfg::kThreads, COLS = Cfg::kCols, KEYS = Cfg::kKeys;
  constexpr int SLICES = KEYS / 16, LIST = Cfg::kScanK * THREADS;
  constexpr int TILE = WG ? kWgTile : int(sizeof(bf16)) * kTile * LDS;  // bytes of one 64-row tile
  extern __shared__ __align__(16) unsigned char dfa_smem[];
  unsigned char* const tiles = WG ? align1024(dfa_smem) : dfa_smem;
  unsigned char* const Kt = tiles;
  unsigned char* const Vt = Kt + KEYS / 64 * TILE;
  // Q and dO of two query chunks: the next one loads during this one.
  unsigned char* const QdO = Vt + KEYS / 64 * TILE;
  auto Qb = [&](int b) { return QdO + 2 * b * TILE; };
  auto dOb = [&](int b) { return QdO + (2 * b + 1) * TILE; };
  float* lse2 = reinterpret_cast<float*>(QdO + 4 * TILE);  // [2][64] per chunk row: lse·log2 e,
  float* dsum = lse2 + 2 * kTile;                                 // D,
  int* cols = reinterpret_cast<int*>(dsum + 2 * kTile);           // first context key | end of own keys << 16
  int2* meta = reinterpret_cast<int2*>(cols + 2 * kTile);         // listed blocks' (first row, anchor)
  int* list = reinterpret_cast<int*>(meta + LIST);
  int* wcount = list + LIST;
  const DFlashAttnDims& d = p.d;
  const int64_t rows = d.T + d.nb * d.block, r0 = int64_t(blockIdx.x) * KEYS, r1 = min(r0 + KEYS, rows);
  const int g = blockIdx.y, group = d.hq / d.hkv, R = group * d.block, nz = (R + kTile - 1) / kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, gr = lane >> 2, t4 = lane & 3;
  const int kw = (warp % SLICES) * 16, col0 = (warp / SLICES) * COLS;  // this warp's key rows and columns
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int rank = int(cluster.block_rank());

  auto kvsrc = [&](const bf16* base, int64_t ld) {
    return [=](int r) -> const bf16* {
      return r0 + r < rows ? base + (r0 + r) * ld + int64_t(g) * d.hd : nullptr;
    };
  };
  // A block's mask on this tile as key offsets from r0, clamped to [−1, KEYS + 1] (the same answer for the
  // offsets 0..KEYS − 1 of the tile): query row kq sees [ctx_lo(kq), ctx_hi) and [own_lo, own_hi(kq)).
  auto rel = [&](int64_t t) { return int(min(max(t - r0, int64_t(-1)), int64_t(KEYS + 1))); };
  const int hd = d.hd;
  const bool vec = p.vec;
  const bf16* any = p.k;
  auto load = [hd, vec, any](unsigned char* dst, auto rows, auto src) {
    if constexpr (WG)
      load_tile_wg<decltype(rows)::value, THREADS>(dst, hd, any, src);
    else
      load_tile<HD, decltype(rows)::value, THREADS>(reinterpret_cast<bf16*>(dst), hd, vec, any, src);
  };
  auto wait = [] {
    if constexpr (WG)
      tile_wait_wg();
    else
      tile_wait();
  };
  load(Kt, std::integral_constant<int, KEYS>{}, kvsrc(p.k, p.ld_k));
  load(Vt, std::integral_constant<int, KEYS>{}, kvsrc(p.v, p.ld_v));

  // dk, dv of this thread's keys: per warp 16 keys × COLS as mma.sync n-tiles, or per warpgroup the wgmma
  // m64n128 fragment (the same element order: acc[i] of the flat one is acc[i / 4][i % 4]).
  std::conditional_t<WG, float[64], float[COLS / 8][4]> dk, dv;
  if constexpr (WG) {
#pragma unroll
    for (int i = 0; i < 64; ++i) dk[i] = dv[i] = 0.0f;
  } else {
#pragma unroll
    for (int i = 0; i < COLS / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;
  }

  // Own rows (≥ T) are seen only by their own blocks: such a tile scans just those, a context tile all.
  const int64_t j_begin = r0 >= d.T ? (r0 - d.T) / d.block : 0;
  const int64_t j_end = r0 >= d.T ? min(d.nb, (r1 - 1 - d.T) / d.block + 1) : d.nb;
  for (int64_t base = j_begin; base < j_end; base += LIST) {
    // Each thread tests kScanK consecutive blocks (their loads in flight together); an exclusive scan of the
    // per-thread counts places the visible ones in the list in block order.
    unsigned seen = 0;
    int2 sa[Cfg::kScanK];
#pragma unroll
    for (int i = 0; i < Cfg::kScanK; ++i) {
      const int64_t jc = base + threadIdx.x * Cfg::kScanK + i;
      if (jc >= j_end) break;
      const BlockMask mc = block_mask(p.blocks, jc, d);
      sa[i] = make_int2(int(mc.s0), int(mc.a));
      if (mc.a >= 0 && ((mc.s0 + mc.lo(0) < r1 && mc.s0 + mc.a > r0) || (mc.bj < r1 && mc.bj + mc.B > r0)))
        seen |= 1u << i;
    }
    const int cnt = __popc(seen);
    int inc = cnt;  // inclusive scan over the warp
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
    }
    if (lane == 31) wcount[warp] = inc;
    __syncthreads();
    int off = inc - cnt, total = 0;
    for (int w = 0; w < THREADS / 32; ++w) {
      off += w < warp ? wcount[w] : 0;
      total += wcount[w];
    }
#pragma unroll
    for (int i = 0; i < Cfg::kScanK; ++i)
      if (seen >> i & 1) {
        meta[off] = sa[i];
        list[off++] = threadIdx.x * Cfg::kScanK + i;
      }
    __syncthreads();

    // Items of this round: (listed block n / nz, query chunk n % nz), Q/dO and row terms double-buffered.
    auto load_item = [&](int n, int b) {
      const int64_t j = base + list[n / nz];
      const int z0 = (n % nz) * kTile;
      const int2 sj = meta[n / nz];
      const BlockMask m{sj.x, sj.y, d.T + j * d.block, d.block, d.window};
      for (int r = threadIdx.x; r < kTile; r += THREADS) {
        const int rr = z0 + r, kq = rr % d.block;
        const bool in = rr < R;
        const int64_t at = (j * d.hq + int64_t(g) * group) * d.block + (in ? rr : 0);
        // A row past the group sees nothing: an empty context range and an empty own range.
        const int lo = in ? rel(m.s0 + m.lo(kq)) : KEYS + 1;
        const int hi = in ? rel(m.bj + (d.window > 0 ? kq + 1 : d.block)) : -1;
        cols[b * kTile + r] = int((uint32_t(lo) & 0xffffu) | (uint32_t(hi) << 16));
        copy4(lse2 + b * kTile + r, p.lse2 + at, in);
        copy4(dsum + b * kTile + r, p.dsum + at, in);
      }
      auto qsrc = [&](const bf16* src, int64_t ld) {
        return [=](int r) -> const bf16* {
          const int rr = z0 + r;
          return rr < R ? src + (j * d.block + rr % d.block) * ld + int64_t(g * group + rr / d.block) * d.hd
                        : nullptr;
        };
      };
      load(Qb(b), std::integral_constant<int, kTile>{}, qsrc(p.q, p.ld_q));
      load(dOb(b), std::integral_constant<int, kTile>{}, qsrc(p.dout, p.ld_dout));
    };
    const int items = total * nz, n0 = items * rank / Cfg::kRanks, n1 = items * (rank + 1) / Cfg::kRanks;
    if (n0 < n1) load_item(n0, 0);
    for (int n = n0; n < n1; ++n) {
      const int b = (n - n0) & 1;
      wait();  // item n (and K/V) landed; every warp is done with item n − 1 (the other buffer)
      if (n + 1 < n1) load_item(n + 1, b ^ 1);
      const int64_t j = base + list[n / nz];
      const int z0 = (n % nz) * kTile;
      const int2 sj = meta[n / nz];
      const BlockMask m{sj.x, sj.y, d.T + j * d.block, d.block, d.window};
      const int ctx_hi = rel(m.s0 + m.a), own_lo = rel(m.bj);
      const int* cb = cols + b * kTile;
      const float *lb = lse2 + b * kTile, *db = dsum + b * kTile;
      // Pᵀ and dSᵀ of NQ 8-column n-tiles (query columns c0 + 8·n2 + 2·t4 + {0, 1}) for key rows xa (elements
      // 0, 1 of an n-tile) and xa + 8 (elements 2, 3), masked pairs 0: element e of n-tile n2 is S(n2, e),
      // Sᵀ that becomes Pᵀ, and DP(n2, e), dPᵀ that becomes dSᵀ.
      // With with_ds false only Pᵀ is formed (the wgmma variant forms dSᵀ later, from Pᵀ, the masked pairs 0).
      auto p_ds = [&](auto nq, int c0, int xa, auto&& S, auto&& DP, auto with_ds) {
#pragma unroll
        for (int n2 = 0; n2 < decltype(nq)::value; ++n2) {
          const int c = c0 + n2 * 8 + 2 * t4;  // the two query columns c, c + 1 of this thread
          const int2 v2 = *reinterpret_cast<const int2*>(cb + c);
          const float2 l2 = *reinterpret_cast<const float2*>(lb + c),
                       ds = *reinterpret_cast<const float2*>(db + c);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int v = e & 1 ? v2.y : v2.x, x = e < 2 ? xa : xa + 8;
            const bool vis = (x >= int(short(v)) && x < ctx_hi) || (x >= own_lo && x < (v >> 16));
            float &se = S(n2, e), &de = DP(n2, e);
            const float pr = vis ? exp2f(se * p.scale_log2 - (e & 1 ? l2.y : l2.x)) : 0.0f;
            se = pr;
            if constexpr (decltype(with_ds)::value) de = pr * (de - (e & 1 ? ds.y : ds.x));
          }
        }
      };
      if constexpr (WG) {
        // Warpgroup wg holds keys [64·wg, 64·wg + 64) of the tile (so warp w's fragment rows are keys kw + gr
        // and kw + gr + 8, as in the mma.sync variant); one that this block cannot see skips the item.
        const int wg = threadIdx.x >> 7;
        if (!m.sees(r0 + 64 * wg, r0 + 64 * wg + 64)) continue;
        // Four groups in flight at most two at a time: Pᵀ is formed while dPᵀ runs, dSᵀ while dV += Pᵀ·dO runs.
        float s[32], dp[32];
        wg_issue_scores(s, Kt + wg * kWgTile, Qb(b), dp, Vt + wg * kWgTile, dOb(b));
        wg_wait<1>(s);
        p_ds(std::integral_constant<int, 8>{}, 0, kw + gr, [&](int n2, int e) -> float& { return s[4 * n2 + e]; },
             [&](int n2, int e) -> float& { return dp[4 * n2 + e]; }, std::false_type{});
        uint32_t pa[4][4];
        wg_a_frags(s, pa);
        wg_issue_product(dv, pa, dOb(b));
        wg_wait<1>(dp);
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const float2 ds = *reinterpret_cast<const float2*>(db + 8 * (i >> 2) + 2 * t4);
          dp[i] = s[i] * (dp[i] - (i & 1 ? ds.y : ds.x));
        }
        uint32_t da[4][4];
        wg_a_frags(dp, da);
        wg_issue_product(dk, da, Qb(b));
        wg_wait<0>(dv);
        wgmma_fence_regs(dk);
      } else {
        // A warp whose 16 keys this block cannot see (tile edges, own rows of other blocks) skips the products.
        if (!m.sees(r0 + kw, r0 + kw + 16)) continue;
        const bf16 *Ks = reinterpret_cast<const bf16*>(Kt), *Vs = reinterpret_cast<const bf16*>(Vt);
        const bf16 *Qs = reinterpret_cast<const bf16*>(Qb(b)), *dOs = reinterpret_cast<const bf16*>(dOb(b));
        // QS query rows per step: QS / 8 independent accumulators per product keep the tensor pipes busy.
        constexpr int QS = Cfg::kQStep, NQ = QS / 8;
#pragma unroll 1
        for (int sub = 0; sub < kTile / QS && z0 + sub * QS < R; ++sub) {
          const bf16 *qs = Qs + sub * QS * LDS, *dos = dOs + sub * QS * LDS;
          float s[NQ][4], dp[NQ][4];
          warp_mma_abt<NQ, HD, LDS>(s, Ks + kw * LDS, qs, lane);
          warp_mma_abt<NQ, HD, LDS>(dp, Vs + kw * LDS, dos, lane);
          p_ds(std::integral_constant<int, NQ>{}, sub * QS, kw + gr,
               [&](int n2, int e) -> float& { return s[n2][e]; },
               [&](int n2, int e) -> float& { return dp[n2][e]; }, std::true_type{});
#pragma unroll
          for (int kk = 0; kk < QS / 16; ++kk) {
            uint32_t a[4];
            acc_to_a_frag(s[2 * kk], s[2 * kk + 1], a);
            warp_mma_ab<COLS / 8, LDS>(dv, a, dos + kk * 16 * LDS + col0, lane);
            acc_to_a_frag(dp[2 * kk], dp[2 * kk + 1], a);
            warp_mma_ab<COLS / 8, LDS>(dk, a, qs + kk * 16 * LDS + col0, lane);
          }
        }
      }
    }
  }

  // This rank's partial into its shared memory (the tiles are dead once every warp is past its last item).
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
  float* part = reinterpret_cast<float*>(tiles);  // [dk, dv][KEYS][HD]
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < COLS / 8; ++i) {
      const int at = (kw + gr + 8 * h) * HD + col0 + i * 8 + 2 * t4;
      float2 k2, v2;
      if constexpr (WG)
        k2 = make_float2(dk[4 * i + 2 * h], dk[4 * i + 2 * h + 1]),
        v2 = make_float2(dv[4 * i + 2 * h], dv[4 * i + 2 * h + 1]);
      else
        k2 = make_float2(dk[i][2 * h], dk[i][2 * h + 1]), v2 = make_float2(dv[i][2 * h], dv[i][2 * h + 1]);
      *reinterpret_cast<float2*>(part + at) = k2;
      *reinterpret_cast<float2*>(part + KEYS * HD + at) = v2;
    }
  cluster.sync();
  // Rank r sums rows [r·KEYS/kRanks, (r + 1)·KEYS/kRanks) over the ranks, in rank order.
  constexpr int RROWS = KEYS / Cfg::kRanks;
  const float scale = d.scale;
  for (int c = threadIdx.x; c < RROWS * HD / 2; c += THREADS) {
    const int row = rank * RROWS + 2 * c / HD, col = 2 * c % HD, at = row * HD + col;
    float2 sk = make_float2(0.0f, 0.0f), sv = sk;
#pragma unroll
    for (int q = 0; q < Cfg::kRanks; ++q) {
      const float* rp = cluster.map_shared_rank(part, q);
      const float2 a = *reinterpret_cast<const float2*>(rp + at),
                   b = *reinterpret_cast<const float2*>(rp + KEYS * HD + at);
      sk.x += a.x, sk.y += a.y, sv.x += b.x, sv.y += b.y;
    }
    const int64_t t = r0 + row;
    if (t >= rows) continue;
    store_two(p.dk + t * p.ld_dk + int64_t(g) * d.hd, col, d.hd, p.pairs, sk.x * scale, sk.y * scale);
    store_two(p.dv + t * p.ld_dv + int64_t(g) * d.hd, col, d.hd, p.pairs, sv.x, sv.y);
  }
  cluster.sync();  // no CTA leaves while another still reads its partial
}

// ---- launchers --------------------------------------------------------------------------------------

void check_dims(const char* op, const DFlashAttnDims& d) {
  if (d.hq > 0 && d.hkv > 0 && d.hkv <= 65535 && d.hq % d.hkv == 0 && d.hd > 0 && d.hd <= 256 &&
      d.block > 0 && d.window >= 0 && d.T >= 0 && d.nb >= 0 && d.nb <= 0x7fffffff &&
      int64_t(d.hq / d.hkv) * d.block <= 65535 * kTile)
    return;
  char what[512];
  std::snprintf(
      what, sizeof(what),
      "bad DFlash attention shape: hq %d hkv %d head_dim %d block %d window %d T %lld blocks %lld (needs "
      "hq a multiple of hkv, 0 < head_dim <= 256, block > 0, window >= 0); HINT: check the drafter "
      "config's heads / kv_heads / head_dim / block_size / sliding_window",
      d.hq, d.hkv, d.hd, d.block, d.window, (long long)d.T, (long long)d.nb);
  cuda_throw(op, what, __FILE__, __LINE__);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Whether a pass takes the wgmma kernels: head dims 65..128 (one 128-column tile, zero-padded) with 16-byte
// copies on a compute capability 9.0 GPU of an sm_90a build. DFLASH_DFA=mma keeps the mma.sync kernels; read
// on every call, so one process can time both.
bool on_wgmma(const DFlashAttnDims& d, bool vec) {
  const char* e = std::getenv("DFLASH_DFA");
  return d.hd > 64 && d.hd <= 128 && vec && !(e && std::strcmp(e, "mma") == 0) && wgmma_available();
}

template <int HD, bool DQ, bool WG>
void query_pass(const QueryArgs& a, cudaStream_t stream) {
  // Q (and dO), K and V of two key tiles; the wgmma tiles need a 1024-byte aligned base.
  const size_t smem =
      WG ? 1024 + size_t(DQ ? 6 : 5) * kWgTile : sizeof(bf16) * size_t(DQ ? 6 : 5) * kTile * (HD + 8);
  DF_CUDA_CHECK(cudaFuncSetAttribute(dfa_query_kernel<HD, DQ, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  const int R = a.d.hq / a.d.hkv * a.d.block;
  dim3 grid(unsigned(a.d.nb), unsigned(a.d.hkv), unsigned((R + kTile - 1) / kTile));
  dfa_query_kernel<HD, DQ, WG><<<grid, 128, smem, stream>>>(a);
  DF_CUDA_CHECK_LAUNCH("dfa_query_kernel");
}

template <int HD, bool WG>
void kv_pass(const KvArgs& a, int64_t kvrows, cudaStream_t stream) {
  using Cfg = KvCfg<HD>;
  const size_t list = size_t(Cfg::kScanK) * Cfg::kThreads;
  const size_t tiles = WG ? size_t(2 * Cfg::kKeys / 64 + 4) * kWgTile
                          : sizeof(bf16) * (2 * Cfg::kKeys + 4 * kTile) * (HD + 8);
  const size_t smem = (WG ? 1024 : 0) +
                      std::max(Cfg::kPartBytes, tiles + sizeof(float) * 4 * kTile + sizeof(int) * 2 * kTile +
                                                    (sizeof(int2) + sizeof(int)) * list +
                                                    sizeof(int) * Cfg::kThreads / 32);
  DF_CUDA_CHECK(cudaFuncSetAttribute(dfa_kv_kernel<HD, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  dim3 grid(unsigned((kvrows + Cfg::kKeys - 1) / Cfg::kKeys), unsigned(a.d.hkv), unsigned(Cfg::kRanks));
  dfa_kv_kernel<HD, WG><<<grid, Cfg::kThreads, smem, stream>>>(a);
  DF_CUDA_CHECK_LAUNCH("dfa_kv_kernel");
}

}  // namespace

void dflash_attention_fwd_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                 int64_t ld_v, const int32_t* blocks, bf16* out, int64_t ld_out, float* lse,
                                 int64_t ld_lse, const DFlashAttnDims& d, cudaStream_t stream) {
  check_dims("dflash_attention_fwd_launch", d);
  if (d.nb == 0) return;
  QueryArgs a{};
  a.q = q, a.k = k, a.v = v, a.ld_q = ld_q, a.ld_k = ld_k, a.ld_v = ld_v, a.blocks = blocks;
  a.o = out, a.ld_o = ld_out, a.lse_out = lse, a.ld_lse = ld_lse, a.d = d, a.scale_log2 = d.scale * kLog2e;
  a.vec = d.hd % 8 == 0 && (ld_q | ld_k | ld_v) % 8 == 0 && aligned16(q) && aligned16(k) && aligned16(v);
  a.pairs = d.hd % 2 == 0 && ld_out % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
  if (on_wgmma(d, a.vec))
    query_pass<128, false, true>(a, stream);
  else
    dispatch_head_dim(d.hd, [&](auto hd) { query_pass<decltype(hd)::value, false, false>(a, stream); });
}

void dflash_attention_bwd_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                 int64_t ld_v, const int32_t* blocks, const bf16* out, int64_t ld_out,
                                 const float* lse, int64_t ld_lse, const bf16* dout, int64_t ld_dout,
                                 bf16* dq, int64_t ld_dq, bf16* dk, int64_t ld_dk, bf16* dv, int64_t ld_dv,
                                 const DFlashAttnDims& d, void* ws, size_t ws_bytes, cudaStream_t stream) {
  check_dims("dflash_attention_bwd_launch", d);
  if (ws_bytes < dflash_attention_bwd_workspace_bytes(d) || (ws == nullptr && d.nb > 0))
    cuda_throw(
        "dflash_attention_bwd_launch",
        "workspace smaller than dflash_attention_bwd_workspace_bytes(dims); HINT: size it with that call",
        __FILE__, __LINE__);
  float* lse2 = static_cast<float*>(ws);
  float* dsum = lse2 + round256(sizeof(float) * size_t(d.nb * d.block) * size_t(d.hq)) / sizeof(float);
  const int64_t qrows = d.nb * d.block, kvrows = d.T + qrows;
  const bool vec = d.hd % 8 == 0 && (ld_q | ld_k | ld_v | ld_dout) % 8 == 0 && aligned16(q) && aligned16(k) &&
                   aligned16(v) && aligned16(dout);
  const bool wg = on_wgmma(d, vec);
  if (d.nb > 0) {
    const int64_t warps = qrows * d.hq;
    dfa_rowterms_kernel<<<unsigned((warps + 7) / 8), 256, 0, stream>>>(
        out, ld_out, dout, ld_dout, lse, ld_lse, lse2, dsum, qrows, d.hq, d.hd, d.block);
    DF_CUDA_CHECK_LAUNCH("dfa_rowterms_kernel");
    QueryArgs a{};
    a.q = q, a.k = k, a.v = v, a.dout = dout, a.ld_q = ld_q, a.ld_k = ld_k, a.ld_v = ld_v,
    a.ld_dout = ld_dout;
    a.blocks = blocks, a.lse2 = lse2, a.dsum = dsum, a.o = dq, a.ld_o = ld_dq, a.d = d;
    a.scale_log2 = d.scale * kLog2e, a.vec = vec;
    a.pairs = d.hd % 2 == 0 && ld_dq % 2 == 0 && reinterpret_cast<uintptr_t>(dq) % 4 == 0;
    if (wg)
      query_pass<128, true, true>(a, stream);
    else
      dispatch_head_dim(d.hd, [&](auto hd) { query_pass<decltype(hd)::value, true, false>(a, stream); });
  }
  if (kvrows == 0) return;
  KvArgs a{};
  a.q = q, a.k = k, a.v = v, a.dout = dout, a.ld_q = ld_q, a.ld_k = ld_k, a.ld_v = ld_v, a.ld_dout = ld_dout;
  a.blocks = blocks, a.lse2 = lse2, a.dsum = dsum, a.dk = dk, a.dv = dv, a.ld_dk = ld_dk;
  a.ld_dv = ld_dv, a.d = d, a.scale_log2 = d.scale * kLog2e, a.vec = vec;
  a.pairs = d.hd % 2 == 0 && (ld_dk | ld_dv) % 2 == 0 && reinterpret_cast<uintptr_t>(dk) % 4 == 0 &&
            reinterpret_cast<uintptr_t>(dv) % 4 == 0;
  if (wg)
    kv_pass<128, true>(a, kvrows, stream);
  else
    dispatch_head_dim(d.hd, [&](auto hd) { kv_pass<decltype(hd)::value, false>(a, kvrows, stream); });
}

}  // namespace df
