// DFlash block attention (train_ops.h DFlashAttnShape, MODELS.md) forward and backward on bf16 tensor cores
// (mma.sync m16n8k16, fp32 accumulation and softmax). One CTA per (block, kv head, 64 rows of the GQA group's
// hq/hkv·B query rows) walks only the visible keys: the context range [s0 + lo, s0 + a) then the B own rows.
// Backward, deterministic without atomics: row terms lse·log2 e and D = rowsum(dO∘O); dq query-major (the
// forward's walk); dk/dv key-major, a cluster of CTAs per (key tile, kv head) sharing, in block order, the
// blocks that see the tile, their fp32 partials summed in a fixed order through distributed shared memory.
// On Hopper at head dims 65..128 the three passes run on wgmma (one warpgroup per 64 query rows or 64 keys,
// operands straight from swizzled shared memory), the query-major ones over pairs of neighbouring blocks that
// share one walk of the union of their context ranges, the dk/dv pass with a four-stage Q/dO ring;
// DFLASH_DFA=wg1 keeps the session-12 wgmma kernels (one block per CTA, two stages), DFLASH_DFA=mma the
// mma.sync kernels. This file holds the query-major kernels and the launchers; the key-major dk/dv kernel
// is dflash_attention_kv.cu.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda_check.cuh"
#include "kernels/dflash_attention.cuh"
#include "kernels/launchers.cuh"
#include "kernels/mma.cuh"
#include "kernels/train_launchers.cuh"
#include "kernels/wgmma_tiles.cuh"

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
};

// Query-major pass over one CTA's 64 query rows of NB consecutive blocks (NB 2: the wgmma variant's pairs).
// Forward (DQ false): online softmax, out and lse. DQ: P from the saved lse, dS = P∘(dO·Vᵀ − D),
// dq = scale·dS·K. Key tile i of the walk holds virtual keys [64i, 64i + 64): virtual key x < nctx is context
// row c0 + x (the union of the blocks' context ranges), the rest the blocks' own rows, which are consecutive;
// a query row sees one context interval [clo, chi) and one own interval [olo, ohi) of virtual keys (for one
// block they meet: one interval), so the mask is a few compares. WG (hd 128 only): each warpgroup of 4 warps
// runs one block's products on wgmma from swizzled tiles (P or dS as the register operand). NB 2 exists
// because these passes are bound by the L2 → SM traffic of K and V (a 64-key tile feeds only 2 or 3 GEMMs of
// 64 query rows): neighbouring anchors see nearly the same context, so a pair shares one walk and each K/V
// tile feeds twice the work.
template <int HD, bool DQ, bool WG, int NB>
__global__ void __launch_bounds__(128 * NB, (WG && NB == 1) ? 2 : 1) dfa_query_kernel(QueryArgs p) {
  static_assert(!WG || HD == 128, "the wgmma variant is written for head dim 128");
  static_assert(NB == 1 || (NB == 2 && WG), "pairs of blocks are a wgmma variant");
  constexpr int LDS = HD + 8, THREADS = 128 * NB;
  constexpr int KSUB = DQ && HD > 128 ? 32 : 64;  // keys per step: S and dP of 64 keys would spill at hd 256
  constexpr int TILE = WG ? kWgTile : int(sizeof(bf16)) * kTile * LDS;  // bytes of one 64-row tile
  extern __shared__ __align__(16) unsigned char dfa_smem[];
  unsigned char* const Qt = WG ? align1024(dfa_smem) : dfa_smem;  // NB tiles, one per block
  unsigned char* const dOt = Qt + NB * TILE;                      // DQ only
  // K, V of KST tiles: the next one loads during this one. Pairs keep three, so that a tile's last product
  // (P·V or dS·K) may still run while the tile after next loads (see the loop).
  constexpr int KST = NB == 2 ? 3 : 2;
  unsigned char* const KV = Qt + (DQ ? 2 : 1) * NB * TILE;
  auto Kb = [&](int b) { return KV + 2 * b * TILE; };
  auto Vb = [&](int b) { return KV + (2 * b + 1) * TILE; };
  const DFlashAttnDims& d = p.d;
  // The drafter's anchors ascend within a sequence, so the last blocks see the most keys: the wgmma variant
  // walks the blocks from the last, which starts the longest CTAs first and leaves short ones for the tail.
  // Pairs put the kv head in blockIdx.x too, fastest, so that the long CTAs of every head start first.
  const int64_t unit = NB == 2 ? blockIdx.x / unsigned(d.hkv) : blockIdx.x;
  const int g = NB == 2 ? int(blockIdx.x % unsigned(d.hkv)) : int(blockIdx.y);
  const int64_t jfirst = NB * (WG ? (d.nb + NB - 1) / NB - 1 - unit : unit);
  const int nblk = int(min(int64_t(NB), d.nb - jfirst));  // blocks of this CTA (the last pair may have one)
  const int wg = threadIdx.x / 128, j_off = min(wg, nblk - 1);
  const int64_t j = jfirst + j_off;  // this warpgroup's block
  // A second warpgroup without a block runs on zero tiles and stores nothing (a branch around its products
  // would make ptxas serialize every wgmma of the kernel).
  const bool mine = wg < nblk;
  const int group = d.hq / d.hkv, R = group * d.block, z0 = blockIdx.z * kTile;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x & 31, gr = lane >> 2, t4 = lane & 3;
  auto q_row = [&](int64_t jb, int r) { return jb * d.block + r % d.block; };  // r: row of the group, < R
  auto q_col = [&](int r) { return int64_t(g * group + r / d.block) * d.hd; };

  // The union of the blocks' context ranges [c0, c0 + nctx); padding blocks (a < 0) see nothing.
  int64_t c0 = 0, c1 = 0;
  bool any_seen = false;
  for (int b = 0; b < nblk; ++b) {
    const BlockMask mb = block_mask(p.blocks, jfirst + b, d);
    if (mb.a < 0) continue;
    c0 = any_seen ? min(c0, mb.s0 + mb.lo(0)) : mb.s0 + mb.lo(0);
    c1 = any_seen ? max(c1, mb.s0 + mb.a) : mb.s0 + mb.a;
    any_seen = true;
  }
  if (!any_seen) {  // padding blocks only: out / dq 0, lse −inf
    for (int c = threadIdx.x; c < nblk * kTile * d.hd; c += THREADS) {
      const int b = c / (kTile * d.hd), r = z0 + c / d.hd % kTile, e = c % d.hd;
      if (r >= R) continue;
      p.o[q_row(jfirst + b, r) * p.ld_o + q_col(r) + e] = __float2bfloat16(0.0f);
      if (!DQ && e == 0) p.lse_out[q_row(jfirst + b, r) * p.ld_lse + g * group + r / d.block] = -INFINITY;
    }
    return;
  }
  const BlockMask m = block_mask(p.blocks, j, d);
  const int64_t nctx = c1 - c0, own0 = d.T + jfirst * d.block;
  const int nkeys = int(nctx) + nblk * d.block;
  auto key_row = [&](int x) { return x < nctx ? c0 + x : own0 + (x - nctx); };

  auto qsrc = [&](const bf16* base, int64_t ld, int64_t jb) {
    return [=](int r) -> const bf16* {
      return z0 + r < R && jb < d.nb ? base + q_row(jb, z0 + r) * ld + q_col(z0 + r) : nullptr;
    };
  };
  auto kvsrc = [&](const bf16* base, int64_t ld, int k0) {
    return [=](int r) -> const bf16* {
      return k0 + r < nkeys ? base + key_row(k0 + r) * ld + int64_t(g) * d.hd : nullptr;
    };
  };
  auto load = [&](unsigned char* dst, auto src) {
    if constexpr (WG)
      load_tile_wg<kTile, THREADS>(dst, d.hd, p.q, src);
    else
      load_tile<HD, kTile, THREADS>(reinterpret_cast<bf16*>(dst), d.hd, p.vec, p.q, src);
  };
  for (int b = 0; b < NB; ++b) {
    load(Qt + b * TILE, qsrc(p.q, p.ld_q, jfirst + b));
    if (DQ) load(dOt + b * TILE, qsrc(p.dout, p.ld_dout, jfirst + b));
  }
  load(Kb(0), kvsrc(p.k, p.ld_k, 0));
  load(Vb(0), kvsrc(p.v, p.ld_v, 0));
  unsigned char* const Qw = Qt + wg * TILE;  // this warpgroup's query and dO tiles
  unsigned char* const dOw = dOt + wg * TILE;

  // The two query rows this thread holds, their visible intervals and (dq) their lse and D.
  int clo[2], chi[2], olo[2], ohi[2];
  float lse2[2] = {0.0f, 0.0f}, dsum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = z0 + warp * 16 + gr + 8 * h, kq = r % d.block;
    const bool in = mine && m.a >= 0 && r < R;
    clo[h] = in ? int(m.s0 + m.lo(kq) - c0) : 0;
    chi[h] = in ? int(m.s0 + m.a - c0) : 0;
    olo[h] = in ? int(nctx) + j_off * d.block : 0;
    ohi[h] = in ? olo[h] + (d.window > 0 ? kq + 1 : d.block) : 0;
    if (DQ && in) {
      const int64_t at = (j * d.hq + int64_t(g) * group) * d.block + r;
      lse2[h] = p.lse2[at];
      dsum[h] = p.dsum[at];
    }
  }
  // Whether virtual key x is visible to row h (for one block the context interval ends where the own one
  // starts).
  auto vis = [&](int x, int h) {
    if constexpr (NB == 1)
      return x >= clo[h] && x < ohi[h];
    else
      return (x >= clo[h] && x < chi[h]) || (x >= olo[h] && x < ohi[h]);
  };

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

  // Pairs leave a tile's last product in flight into the next tile (its A fragment in a_run) and wait for it
  // behind that tile's first product, so that it runs across the barrier and the copies' issue; the buffer it
  // reads is next written two tiles later, after every warp has waited for it and passed a barrier.
  uint32_t a_run[4][4];
  for (int k0 = 0, buf = 0; k0 < nkeys; k0 += kTile, buf = buf + 1 == KST ? 0 : buf + 1) {
    // Tile k0 landed; every warp is done with the buffer the next tile takes (tile k0 − 64·(KST − 1)).
    if constexpr (WG)
      tile_wait_wg();
    else
      tile_wait();
    if (k0 + kTile < nkeys) {
      const int next = buf + 1 == KST ? 0 : buf + 1;
      load(Kb(next), kvsrc(p.k, p.ld_k, k0 + kTile));
      load(Vb(next), kvsrc(p.v, p.ld_v, k0 + kTile));
    }
    if constexpr (WG && !DQ && NB == 2) {
      // The forward of a pair: P·V of the previous tile completes with this tile's scores (o is rescaled
      // below, so it must be).
      float s[32];
      wg_issue_score(s, Qw, Kb(buf));
      wg_wait<0>(s);
      wgmma_fence_regs(o);
      for (auto& ak : a_run) wgmma_fence_regs(ak);
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int x = k0 + 8 * (i >> 2) + 2 * t4 + (i & 1), h = (i >> 1) & 1;
        s[i] = vis(x, h) ? s[i] * p.scale_log2 : -INFINITY;
      }
      float corr[2];
      softmax_step<8>([&](int n, int e) -> float& { return s[4 * n + e]; }, mx_run, l, corr);
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] *= corr[(i >> 1) & 1];
      wg_a_frags(s, a_run);
      wg_issue_product(o, a_run, Vb(buf));
    } else if constexpr (WG && DQ && NB == 2) {
      // The dq pass of a pair: dS·K of the previous tile completes with this tile's S (groups complete in
      // order).
      float s[32], dp[32];
      wg_issue_scores(s, Qw, Kb(buf), dp, dOw, Vb(buf));
      wg_wait<1>(s);
      for (auto& ak : a_run) wgmma_fence_regs(ak);
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int x = k0 + 8 * (i >> 2) + 2 * t4 + (i & 1), h = (i >> 1) & 1;
        s[i] = vis(x, h) ? exp2f(s[i] * p.scale_log2 - lse2[h]) : 0.0f;
      }
      wg_wait<0>(dp);
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] *= dp[i] - dsum[(i >> 1) & 1];
      wg_a_frags(s, a_run);
      wg_issue_product(o, a_run, Kb(buf));
    } else if constexpr (WG && !DQ) {
      // The mma.sync step on the wgmma fragment: masked scores, the online softmax, o += P·V.
      float s[32];
      wg_score(s, Qw, Kb(buf));
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int x = k0 + 8 * (i >> 2) + 2 * t4 + (i & 1), h = (i >> 1) & 1;
        s[i] = vis(x, h) ? s[i] * p.scale_log2 : -INFINITY;
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
      wg_issue_scores(s, Qw, Kb(buf), dp, dOw, Vb(buf));
      wg_wait<1>(s);
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int x = k0 + 8 * (i >> 2) + 2 * t4 + (i & 1), h = (i >> 1) & 1;
        s[i] = vis(x, h) ? exp2f(s[i] * p.scale_log2 - lse2[h]) : 0.0f;
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
            s[n][e] = vis(x, h) ? s[n][e] * p.scale_log2 : -INFINITY;
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
  if constexpr (WG && NB == 2) {  // the last tile's product
    wg_wait<0>(o);
    for (auto& ak : a_run) wgmma_fence_regs(ak);
  }
  if (!mine) return;
  const bool pad = m.a < 0;  // a padding block of a pair: out / dq 0 (whatever its dO holds), lse −inf

  float fin[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!DQ) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    fin[h] = DQ ? d.scale : l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = z0 + warp * 16 + gr + 8 * h;
    if (r >= R) continue;
    bf16* orow = p.o + q_row(j, r) * p.ld_o + q_col(r);
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) {
      float x0, x1;
      if constexpr (WG)
        x0 = o[4 * i + 2 * h], x1 = o[4 * i + 2 * h + 1];
      else
        x0 = o[i][2 * h], x1 = o[i][2 * h + 1];
      store_two(orow, i * 8 + 2 * t4, d.hd, p.pairs, pad ? 0.0f : x0 * fin[h], pad ? 0.0f : x1 * fin[h]);
    }
    if (!DQ && t4 == 0)  // natural-log lse of the scaled scores: (max + log2 Σ) / log2 e
      p.lse_out[q_row(j, r) * p.ld_lse + g * group + r / d.block] =
          l[h] > 0.0f ? (mx_run[h] + log2f(l[h])) / kLog2e : -INFINITY;
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

// Which kernels a pass takes. wgmma: head dims 65..128 (one 128-column tile, zero-padded) with 16-byte copies
// on a compute capability 9.0 GPU of an sm_90a build; by default its query-major passes walk pairs of blocks
// and its dk/dv pass keeps two items' copies in flight and defers dK; DFLASH_DFA=wg1 keeps session 12's
// wgmma kernels (one block per CTA, two stages). DFLASH_DFA=mma keeps the mma.sync kernels. Read on every
// call, so one process can time all three.
enum class Path { mma, wg1, wg2 };
Path path_for(const DFlashAttnDims& d, bool vec) {
  const char* e = std::getenv("DFLASH_DFA");
  if (!(d.hd > 64 && d.hd <= 128 && vec && !(e && std::strcmp(e, "mma") == 0) && wgmma_available()))
    return Path::mma;
  // Pairs put (pair, kv head) in one grid dimension.
  const bool fits = (d.nb + 1) / 2 * d.hkv <= 0x7fffffff;
  return (e && std::strcmp(e, "wg1") == 0) || !fits ? Path::wg1 : Path::wg2;
}

template <int HD, bool DQ, bool WG, int NB>
void query_pass(const QueryArgs& a, cudaStream_t stream) {
  // Q (and dO) of each block, K and V of two key tiles (three for pairs); the wgmma tiles need a 1024-byte
  // aligned base.
  const size_t tiles = size_t(NB * (DQ ? 2 : 1) + (NB == 2 ? 6 : 4));
  const size_t smem = WG ? 1024 + tiles * kWgTile : sizeof(bf16) * tiles * kTile * (HD + 8);
  DF_CUDA_CHECK(cudaFuncSetAttribute(dfa_query_kernel<HD, DQ, WG, NB>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int R = a.d.hq / a.d.hkv * a.d.block;
  const int64_t units = (a.d.nb + NB - 1) / NB;
  dim3 grid(unsigned(NB == 2 ? units * a.d.hkv : units), unsigned(NB == 2 ? 1 : a.d.hkv),
            unsigned((R + kTile - 1) / kTile));
  dfa_query_kernel<HD, DQ, WG, NB><<<grid, 128 * NB, smem, stream>>>(a);
  DF_CUDA_CHECK_LAUNCH("dfa_query_kernel");
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
  const Path path = path_for(d, a.vec);
  if (path == Path::wg2)
    query_pass<128, false, true, 2>(a, stream);
  else if (path == Path::wg1)
    query_pass<128, false, true, 1>(a, stream);
  else
    dispatch_head_dim(d.hd, [&](auto hd) { query_pass<decltype(hd)::value, false, false, 1>(a, stream); });
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
  const Path path = path_for(d, vec);
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
    if (path == Path::wg2)
      query_pass<128, true, true, 2>(a, stream);
    else if (path == Path::wg1)
      query_pass<128, true, true, 1>(a, stream);
    else
      dispatch_head_dim(d.hd, [&](auto hd) { query_pass<decltype(hd)::value, true, false, 1>(a, stream); });
  }
  if (kvrows == 0) return;
  KvArgs a{};
  a.q = q, a.k = k, a.v = v, a.dout = dout, a.ld_q = ld_q, a.ld_k = ld_k, a.ld_v = ld_v, a.ld_dout = ld_dout;
  a.blocks = blocks, a.lse2 = lse2, a.dsum = dsum, a.dk = dk, a.dv = dv, a.ld_dk = ld_dk;
  a.ld_dv = ld_dv, a.d = d, a.scale_log2 = d.scale * kLog2e, a.vec = vec;
  a.pairs = d.hd % 2 == 0 && (ld_dk | ld_dv) % 2 == 0 && reinterpret_cast<uintptr_t>(dk) % 4 == 0 &&
            reinterpret_cast<uintptr_t>(dv) % 4 == 0;
  dfa::kv_pass_launch(a, kvrows, path != Path::mma, path == Path::wg2, stream);
}

}  // namespace df