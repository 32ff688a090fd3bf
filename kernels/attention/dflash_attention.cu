// DFlash block attention (train_ops.h DFlashAttnShape, MODELS.md) forward and backward on bf16 tensor cores
// (mma.sync m16n8k16, fp32 accumulation and softmax). One CTA per (block, kv head, 64 rows of the GQA group's
// hq/hkv·B query rows) walks only the visible keys: the context range [s0 + lo, s0 + a) then the B own rows.
// Backward, deterministic without atomics: row terms lse·log2 e and D = rowsum(dO∘O); dq query-major (the
// forward's walk); dk/dv key-major, a cluster of CTAs per (key tile, kv head) sharing, in block order, the
// blocks that see the tile, their fp32 partials summed in a fixed order through distributed shared memory.
// On Hopper at head dims 65..128 the three passes run the same walks on wgmma (one warpgroup per 64 query
// rows or 64 keys, operands straight from swizzled shared memory), the query-major ones streaming K and V by
// TMA; dflash_attention_kernel_choose (kernels/dispatch/dispatch.h) picks them. This file holds the
// query-major kernels and the launchers; the key-major dk/dv kernel is dflash_attention_kv.cu.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <type_traits>

#include "kernels/attention/dflash_attention.cuh"
#include "kernels/dispatch/dispatch.h"
#include "kernels/launchers.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/mma.cuh"
#include "kernels/primitives/pdl.cuh"
#include "kernels/primitives/tma.cuh"
#include "kernels/primitives/wgmma_tiles.cuh"
#include "kernels/train_launchers.cuh"

namespace df {

namespace {

using namespace dfa;

// ---- kernels ----------------------------------------------------------------------------------------

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
  // own_kv (dq pass on the wgmma kernel, a group of at most 64 query rows): the CTA also writes dk and dv of
  // its block's own rows, which no other block sees (the dk/dv pass then covers the context rows only).
  bool own_kv, kv_pairs;  // kv_pairs: dk and dv take two-element stores
  bf16 *dk, *dv;
  int64_t ld_dk, ld_dv;
};

// ---- own rows' dk and dv in the dq pass (QueryArgs::own_kv) --------------------------------------------
// The own-key columns of the own tile's P and dS go to shared memory transposed (key-major, kOwnLd bf16 a
// row), so that the key rows are the M of a 16×16 A fragment (ldmatrix) for dV = Pᵀ·dO and dK = scale·dSᵀ·Q.
constexpr int kOwnLd = kTile + 8;

// This thread's 32 (query, key) values of a 64×64 m16n8 accumulator (wgmma fragment order) into
// pt[key][query] as bf16, keys below `keys` only.
__device__ __forceinline__ void own_stash(const float (&s)[32], bf16* pt, int keys, int warp, int gr,
                                          int t4) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int key = 8 * (i >> 2) + 2 * t4 + (i & 1), row = 16 * warp + gr + 8 * ((i >> 1) & 1);
    if (key < keys) pt[key * kOwnLd + row] = __float2bfloat16(s[i]);
  }
}

// acc[16 keys × 32 columns] += A·B over the 64 query rows: A the 16 key rows [k0, k0 + 16) of pt (own_stash's
// layout), B the 64-row wgmma tile `tile` (rows are the queries; columns [c0, c0 + 32)) read transposed with
// ldmatrix.trans from its swizzled 16-byte chunks.
__device__ __forceinline__ void own_product(float (&acc)[4][4], const bf16* pt, int k0,
                                            const unsigned char* tile, int c0, int lane) {
  const int mat = lane >> 3, r8 = lane & 7;
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, pt + (k0 + (mat & 1) * 8 + r8) * kOwnLd + kk * 16 + (mat >> 1) * 8);
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      uint32_t f[4];
      ldmatrix_x4_trans(f,
                        tile + wg_tile_offset(kk * 16 + (mat & 1) * 8 + r8, (c0 + np * 16) / 8 + (mat >> 1)));
      mma_bf16_16816(acc[2 * np], a[0], a[1], a[2], a[3], f[0], f[1]);
      mma_bf16_16816(acc[2 * np + 1], a[0], a[1], a[2], a[3], f[2], f[3]);
    }
  }
}

// Query-major pass over one CTA's 64 query rows. Forward (DQ false): online softmax, out and lse. DQ: P from
// the saved lse, dS = P∘(dO·Vᵀ − D), dq = scale·dS·K. Key tile i of the walk holds virtual keys [KT·i, KT·i +
// KT) (KT 64, fewer in the small form: query_keys): virtual key x < nctx is context row c0 + x, the rest own
// rows; every query row sees one interval [ilo, ihi) of virtual keys, so the mask is two compares. WG (hd 128
// only): the 4 warps are one warpgroup running the products on wgmma from swizzled tiles (P or dS as the
// register operand); two CTAs fit an SM. One thread streams each K/V tile as 64 whole rows by bulk tensor
// copies (tm_k, tm_v) on the buffer's mbarrier, so the other threads spend no instructions on copies (Q and
// dO load as one pass over their shared rows); the walk then takes the context keys in 64-key tiles from c0
// (rows past the context range are loaded and masked) and the own rows as one more tile from bj. A masked key
// still multiplies its V (dq: K) row by a zero weight, so every k/v row the tensors hold must be finite, as
// the drafter's projections write them; rows past the tensors' ends arrive as zeros.
template <int HD, bool DQ, bool WG, int KT>
__global__ void __launch_bounds__(128, WG ? 2 : 1)
    dfa_query_kernel(QueryArgs p, const __grid_constant__ CUtensorMap tm_k,
                     const __grid_constant__ CUtensorMap tm_v) {
  static_assert(!WG || (HD == 128 && KT == kTile),
                "the wgmma variant is written for head dim 128, 64-key tiles");
  static_assert(KT % 16 == 0 && KT <= kTile, "whole 16-key steps, at most the 64-row Q tile's keys");
  constexpr int LDS = HD + 8;
  // keys per step: S and dP of 64 keys would spill at hd 256; at most the tile
  constexpr int KSUB = std::min(KT, DQ && HD > 128 ? 32 : 64);
  constexpr int TILE = WG ? kWgTile : int(sizeof(bf16)) * kTile * LDS;  // bytes of the 64-row Q (dO) tile
  constexpr int KVT = WG ? kWgTile : int(sizeof(bf16)) * KT * LDS;      // bytes of one K or V tile
  extern __shared__ __align__(16) unsigned char dfa_smem[];
  unsigned char* const Qt = WG ? align1024(dfa_smem) : dfa_smem;
  unsigned char* const dOt = Qt + TILE;                 // DQ only
  unsigned char* const KV = Qt + (DQ ? 2 : 1) * TILE;  // K, V of two tiles: the next one loads during this one
  auto Kb = [&](int b) { return KV + 2 * b * KVT; };
  auto Vb = [&](int b) { return KV + (2 * b + 1) * KVT; };
  const DFlashAttnDims& d = p.d;
  // The drafter's anchors ascend within a sequence, so the last blocks see the most keys: the wgmma variant
  // walks the blocks from the last, which starts the longest CTAs first and leaves short ones for the tail.
  const int64_t j = WG ? d.nb - 1 - blockIdx.x : blockIdx.x;
  const int g = blockIdx.y, group = d.hq / d.hkv, R = group * d.block, z0 = blockIdx.z * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, gr = lane >> 2, t4 = lane & 3;
  const BlockMask m = block_mask(p.blocks, j, d);
  auto q_row = [&](int r) { return j * d.block + r % d.block; };  // r: row of the group, < R
  auto q_col = [&](int r) { return int64_t(g * group + r / d.block) * d.hd; };

  // A padding block: out / dq 0, lse −inf (own_kv: its own rows' dk and dv 0, as no query sees them).
  if (m.a < 0) {
    for (int c = threadIdx.x; c < kTile * d.hd; c += blockDim.x) {
      const int r = z0 + c / d.hd, e = c % d.hd;
      if (r >= R) continue;
      p.o[q_row(r) * p.ld_o + q_col(r) + e] = __float2bfloat16(0.0f);
      if (!DQ && e == 0) p.lse_out[q_row(r) * p.ld_lse + g * group + r / d.block] = -INFINITY;
    }
    if (DQ && p.own_kv)
      for (int c = threadIdx.x; c < d.block * d.hd; c += blockDim.x) {
        const int64_t row = m.bj + c / d.hd, e = int64_t(g) * d.hd + c % d.hd;
        p.dk[row * p.ld_dk + e] = __float2bfloat16(0.0f);
        p.dv[row * p.ld_dv + e] = __float2bfloat16(0.0f);
      }
    pdl_wait();  // see the kernel's end
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
  auto load = [&](unsigned char* dst, auto rows, auto src) {
    if constexpr (WG)
      load_tile_wg<decltype(rows)::value, 128>(dst, d.hd, p.q, src);
    else
      load_tile<HD, decltype(rows)::value, 128>(reinterpret_cast<bf16*>(dst), d.hd, p.vec, p.q, src);
  };
  // K and V tile rows [k0, k0 + KT) into buffer b (mma.sync; the wgmma kernel streams them by TMA).
  auto load_kv = [&](int b, int k0) {
    load(Kb(b), std::integral_constant<int, KT>{}, kvsrc(p.k, p.ld_k, k0));
    load(Vb(b), std::integral_constant<int, KT>{}, kvsrc(p.v, p.ld_v, k0));
  };
  if (WG && DQ) {
    load_tile_pair_wg<kTile, 128>(Qt, p.q, p.ld_q, dOt, p.dout, p.ld_dout, d.hd, [&](int r) {
      const int rr = z0 + r;
      return rr < R ? RowAt{q_row(rr), q_col(rr)} : RowAt{-1, 0};
    });
  } else {
    load(Qt, std::integral_constant<int, kTile>{}, qsrc(p.q, p.ld_q));
    if (DQ) load(dOt, std::integral_constant<int, kTile>{}, qsrc(p.dout, p.ld_dout));
  }
  // WG: the buffers' mbarriers after the tiles; tile t of the walk starts at virtual key tile_k0(t) and
  // its rows past tile_cap(t) are not keys of the walk (a context tile's rows beyond nctx).
  const uint32_t bars = static_cast<uint32_t>(__cvta_generic_to_shared(KV + 4 * KVT));
  const int nct = int((nctx + kTile - 1) / kTile);  // context tiles of the TMA walk
  const int ntiles = WG ? nct + 1 : (nkeys + KT - 1) / KT;
  auto tile_k0 = [&](int t) { return WG && t == nct ? int(nctx) : t * KT; };
  auto tile_cap = [&](int t) { return WG && t < nct ? int(nctx) : nkeys; };
  auto tma_kv = [&](int b, int t) {  // one thread: tile t's K and V into buffer b
    const int64_t row = t == nct ? m.bj : c0 + int64_t(t) * kTile;
    const uint32_t bar = bars + 8 * b;
    mbar_arrive_expect(bar, 2 * kWgTile);
    tma_load_tile<128, kTile>(static_cast<uint32_t>(__cvta_generic_to_shared(Kb(b))), &tm_k, g * d.hd,
                              int(row), bar);
    tma_load_tile<128, kTile>(static_cast<uint32_t>(__cvta_generic_to_shared(Vb(b))), &tm_v, g * d.hd,
                              int(row), bar);
  };
  if constexpr (WG) {
    if (threadIdx.x == 0) {
      mbar_init(bars, 1);
      mbar_init(bars + 8, 1);
      DF_SM90_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    tile_wait_wg();  // Q (and dO) landed, the barriers initialised
    if (threadIdx.x == 0) tma_kv(0, 0);
  } else {
    load_kv(0, 0);
  }

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

  for (int t = 0, buf = 0; t < ntiles; ++t, buf ^= 1) {
    const int k0 = tile_k0(t);
    // Tile t landed; every warp is done with the other buffer (tile t − 1).
    if constexpr (WG) {
      __syncthreads();
      mbar_wait(bars + 8 * buf, (t >> 1) & 1);
    } else {
      tile_wait();
    }
    auto load_next = [&] {
      if constexpr (WG) {
        if (threadIdx.x == 0 && t + 1 < ntiles) tma_kv(buf ^ 1, t + 1);
      } else {
        if (k0 + KT < nkeys) load_kv(buf ^ 1, k0 + KT);
      }
    };
    int hi[2];  // this tile's visible keys end at hi (a TMA context tile also holds rows past the context)
#pragma unroll
    for (int h = 0; h < 2; ++h) hi[h] = min(ihi[h], tile_cap(t));
    // The wgmma forward issues the next tile's copies once this tile's scores are on the tensor cores (a
    // little faster than before them; the dq pass is a little slower that way).
    if (!(WG && !DQ)) load_next();
    if constexpr (WG && !DQ) {
      // The mma.sync step on the wgmma fragment: masked scores, the online softmax, o += P·V.
      float s[32];
      wg_issue_score(s, Qt, Kb(buf));
      load_next();
      wg_wait<0>(s);
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int x = k0 + 8 * (i >> 2) + 2 * t4 + (i & 1), h = (i >> 1) & 1;
        s[i] = x >= ilo[h] && x < hi[h] ? s[i] * p.scale_log2 : -INFINITY;
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
        s[i] = x >= ilo[h] && x < hi[h] ? exp2f(s[i] * p.scale_log2 - lse2[h]) : 0.0f;
      }
      // own_kv: the walk's last tile holds the own keys from column 0; their P and dS go to the other
      // buffer's K and V tiles, free since this is the last tile (no next copy) and every warp is done with
      // tile t − 1 (the barrier above).
      const bool own = p.own_kv && t == nct;
      bf16* const own_p = reinterpret_cast<bf16*>(Kb(buf ^ 1));
      if (own) own_stash(s, own_p, d.block, warp, gr, t4);
      wg_wait<0>(dp);
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] *= dp[i] - dsum[(i >> 1) & 1];
      if (own) own_stash(s, own_p + kTile * kOwnLd, d.block, warp, gr, t4);
      uint32_t a[4][4];
      wg_a_frags(s, a);
      wg_product(o, a, Kb(buf));
    } else {
      const bf16 *Ks = reinterpret_cast<const bf16*>(Kb(buf)), *Vs = reinterpret_cast<const bf16*>(Vb(buf));
      for (int kh = 0; kh < KT && k0 + kh < nkeys; kh += KSUB) {
        float s[KSUB / 8][4];
        warp_mma_abt<KSUB / 8, HD, LDS>(s, qw, Ks + kh * LDS, lane);
#pragma unroll
        for (int n = 0; n < KSUB / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int x = k0 + kh + n * 8 + 2 * t4 + (e & 1), h = e >> 1;
            s[n][e] = x >= ilo[h] && x < hi[h] ? s[n][e] * p.scale_log2 : -INFINITY;
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
  if constexpr (WG && DQ) {
    // dV = Pᵀ·dO and dK = scale·dSᵀ·Q of the block's own keys, summed over this CTA's 64 query rows (every
    // query row that sees them): warp w takes head columns [32w, 32w + 32) of each 16-key row group.
    if (p.own_kv) __syncthreads();  // every warp's P and dS are in shared memory
    const bf16* own_p = reinterpret_cast<const bf16*>(Kb(((ntiles - 1) % 2) ^ 1));
    const bf16* own_ds = own_p + kTile * kOwnLd;
    for (int k0 = 0; p.own_kv && k0 < d.block; k0 += 16) {
      float av[4][4] = {}, ak[4][4] = {};
      own_product(av, own_p, k0, dOt, 32 * warp, lane);
      own_product(ak, own_ds, k0, Qt, 32 * warp, lane);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int key = k0 + gr + 8 * h;
        if (key >= d.block) continue;
        bf16* dkrow = p.dk + (m.bj + key) * p.ld_dk + int64_t(g) * d.hd;
        bf16* dvrow = p.dv + (m.bj + key) * p.ld_dv + int64_t(g) * d.hd;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const int col = 32 * warp + 8 * n + 2 * t4;
          store_two(dkrow, col, d.hd, p.kv_pairs, ak[n][2 * h] * d.scale, ak[n][2 * h + 1] * d.scale);
          store_two(dvrow, col, d.hd, p.kv_pairs, av[n][2 * h], av[n][2 * h + 1]);
        }
      }
    }
  }
  // Launched with programmatic dependent launch behind the dk/dv pass (dflash_attention_bwd_plan's kv_first; a no-op
  // otherwise), this CTA reads nothing that pass writes, but it ends only once that pass has ended with its writes
  // visible, so that this grid's end implies the dk/dv pass's for whatever the stream runs next.
  pdl_wait();
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

// Whether a pass takes the wgmma kernels (dflash_attention_kernel_choose): head dims 65..128 (one 128-column
// tile, zero-padded) with 16-byte copies, and every K/V row within the TMA's 32-bit row coordinates.
bool on_wgmma(const DFlashAttnDims& d, bool vec) {
  const bool shape = d.hd > 64 && d.hd <= 128 && vec && d.T + d.nb * d.block <= INT32_MAX;
  return dflash_attention_kernel_choose(device_caps(), kernel_variants(), shape) == DFlashAttnKernel::wgmma;
}

// The mma.sync query pass's shared memory: the 64-row Q (and dO) tile and K and V of two tiles of `keys`
// keys.
constexpr size_t query_smem(int hd, bool dq, int keys) {
  return sizeof(bf16) * size_t(hd + 8) * size_t((dq ? 2 : 1) * kTile + 4 * keys);
}

// Keys per K/V tile of the mma.sync query pass: 64 in the large form; the small form halves them until the
// pass fits kSmallSmem (32 keys for the forward at head dim 256 and the dq pass at 128, 16 for the dq pass at
// 256). The warps keep their 16 query rows each and the tiles stay double-buffered, so the next keys still
// load while mma.sync runs on these; only the steps between barriers get shorter. Query rows are not cut
// instead: a CTA of fewer warps leaves an sm_120 SM, which holds one CTA of this size, with fewer warps to
// hide latency.
constexpr int query_keys(int hd, bool dq, bool small) {
  int keys = kTile;
  while (small && keys > 16 && query_smem(hd, dq, keys) > kSmallSmem) keys /= 2;
  return keys;
}
constexpr bool query_small_fits() {
  for (int hd = 16; hd <= 256; hd *= 2)
    for (int dq = 0; dq < 2; ++dq)
      if (query_smem(hd, dq, query_keys(hd, dq, true)) > kSmallSmem) return false;
  return true;
}
static_assert(query_small_fits(), "the small form of every head dim fits kSmallSmem");

// pdl: launched with programmatic dependent launch behind the dk/dv pass, whose results it does not read: its
// CTAs start as the dk/dv pass's last ones leave SMs free, and it does not wait for it.
template <int HD, bool DQ, bool WG, int KT>
void query_pass(const QueryArgs& a, bool pdl, cudaStream_t stream) {
  // Q (and dO), K and V of two key tiles (and the TMA walk's two mbarriers); the wgmma tiles need a
  // 1024-byte aligned base.
  const size_t smem = WG ? 1024 + size_t(DQ ? 6 : 5) * kWgTile + 16 : query_smem(HD, DQ, KT);
  kernel_smem_opt_in(reinterpret_cast<const void*>(dfa_query_kernel<HD, DQ, WG, KT>), smem,
                     "dfa_query_kernel");
  const int R = a.d.hq / a.d.hkv * a.d.block;
  dim3 grid(unsigned(a.d.nb), unsigned(a.d.hkv), unsigned((R + kTile - 1) / kTile));
  CUtensorMap tm_k{}, tm_v{};
  if constexpr (WG) {  // whole rows of all k/v rows, 64-row boxes: a tile is one copy per 64 columns
    const int64_t kvrows = a.d.T + a.d.nb * a.d.block, cols = int64_t(a.d.hkv) * a.d.hd;
    tm_k = tensor_map_bf16(a.k, kvrows, cols, a.ld_k, kTile);
    tm_v = tensor_map_bf16(a.v, kvrows, cols, a.ld_v, kTile);
  }
  if (pdl) {
    launch_pdl(dfa_query_kernel<HD, DQ, WG, KT>, grid, dim3(128), smem, stream, a, tm_k, tm_v);
  } else {
    dfa_query_kernel<HD, DQ, WG, KT><<<grid, 128, smem, stream>>>(a, tm_k, tm_v);
    DF_CUDA_CHECK_LAUNCH("dfa_query_kernel");
  }
}

// The query-major pass on the path on_wgmma chose, the mma.sync one in the form dispatch picks for the
// device.
template <bool DQ>
void query_pass_any(const QueryArgs& a, bool wg, bool pdl, cudaStream_t stream) {
  if (wg) {
    query_pass<128, DQ, true, kTile>(a, pdl, stream);
    return;
  }
  dispatch_head_dim(a.d.hd, [&](auto hd) {
    constexpr int HD = decltype(hd)::value, SMALL_KT = query_keys(HD, DQ, true);
    const bool small = dflash_attention_form_choose(device_caps(), kernel_variants(),
                                                    query_smem(HD, DQ, kTile)) == DFlashAttnForm::small;
    if (small && SMALL_KT < kTile)
      query_pass<HD, DQ, false, SMALL_KT>(a, pdl, stream);
    else
      query_pass<HD, DQ, false, kTile>(a, pdl, stream);
  });
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
  query_pass_any<false>(a, on_wgmma(d, a.vec), false, stream);
}

DFlashBwdPlan dflash_attention_bwd_plan(const DFlashAttnDims& d, bool aligned) {
  DFlashBwdPlan p;
  // The dq pass writes the own rows' dk and dv (QueryArgs::own_kv) where it runs on the wgmma kernel with a
  // group of at most 64 query rows, and the dk/dv pass covers the context rows only.
  const bool one_chunk = d.hq / d.hkv * d.block <= kTile;
  p.own_rows_in_dq = d.nb > 0 && on_wgmma(d, aligned) && one_chunk;
  // The dk/dv pass first, then the dq pass, launched so that it fills the dk/dv pass's tail (query_pass's
  // pdl; it waits for nothing, so the dk/dv pass must run between it and the row terms); without dk/dv
  // rows only the dq pass runs.
  const int64_t kv_rows = p.own_rows_in_dq ? d.T : d.T + d.nb * d.block;
  p.kv_first = d.nb > 0 && kv_rows > 0;
  return p;
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
  const bool kv_pairs = d.hd % 2 == 0 && (ld_dk | ld_dv) % 2 == 0 &&
                        reinterpret_cast<uintptr_t>(dk) % 4 == 0 && reinterpret_cast<uintptr_t>(dv) % 4 == 0;
  const bool one_chunk = d.hq / d.hkv * d.block <= kTile;  // a group of at most 64 query rows
  const DFlashBwdPlan plan = dflash_attention_bwd_plan(d, vec);
  const bool own_kv = plan.own_rows_in_dq, overlap = plan.kv_first;
  const int64_t kv_rows = own_kv ? d.T : kvrows;  // the rows the dk/dv pass writes
  QueryArgs qa{};
  if (d.nb > 0) {
    const int64_t warps = qrows * d.hq;
    dfa_rowterms_kernel<<<unsigned((warps + 7) / 8), 256, 0, stream>>>(
        out, ld_out, dout, ld_dout, lse, ld_lse, lse2, dsum, qrows, d.hq, d.hd, d.block);
    DF_CUDA_CHECK_LAUNCH("dfa_rowterms_kernel");
    qa.q = q, qa.k = k, qa.v = v, qa.dout = dout, qa.ld_q = ld_q, qa.ld_k = ld_k, qa.ld_v = ld_v,
    qa.ld_dout = ld_dout;
    qa.blocks = blocks, qa.lse2 = lse2, qa.dsum = dsum, qa.o = dq, qa.ld_o = ld_dq, qa.d = d;
    qa.scale_log2 = d.scale * kLog2e, qa.vec = vec;
    qa.pairs = d.hd % 2 == 0 && ld_dq % 2 == 0 && reinterpret_cast<uintptr_t>(dq) % 4 == 0;
    qa.own_kv = own_kv, qa.kv_pairs = kv_pairs, qa.dk = dk, qa.dv = dv, qa.ld_dk = ld_dk, qa.ld_dv = ld_dv;
    if (!overlap) query_pass_any<true>(qa, wg, false, stream);
  }
  KvArgs a{};  // kv_pass_launch launches nothing without k/v rows
  a.q = q, a.k = k, a.v = v, a.dout = dout, a.ld_q = ld_q, a.ld_k = ld_k, a.ld_v = ld_v, a.ld_dout = ld_dout;
  a.blocks = blocks, a.lse2 = lse2, a.dsum = dsum, a.dk = dk, a.dv = dv, a.ld_dk = ld_dk;
  a.ld_dv = ld_dv, a.d = d, a.scale_log2 = d.scale * kLog2e, a.vec = vec;
  a.pairs = kv_pairs;
  a.blk_magic = block_magic(d.block);
  // The wgmma dk/dv pass streams Q and dO by TMA where a group has at most 64 query rows (one box a block).
  a.tma = wg && one_chunk;
  // The dk/dv pass's grid in tile order within groups of 4 kv heads (all of them where 4 does not divide
  // hkv; dfa_kv_kernel).
  a.head_group = d.hkv % 4 == 0 ? 4 : d.hkv;
  a.overlap = overlap;
  a.rows = kv_rows;
  dfa::kv_pass_launch(a, wg, stream);
  if (overlap) query_pass_any<true>(qa, wg, true, stream);
}

}  // namespace df