// DFlash block attention backward, the key-major dk/dv pass (kernels/attention/dflash_attention.cu has the forward, the dq
// pass and the launchers): a cluster of CTAs per (key tile, kv head) walks, in block order, the blocks that see
// the tile and sums the CTAs' fp32 partials in a fixed order through distributed shared memory, so dk and dv are
// deterministic without atomics. On Hopper at head dims 65..128 the products run on wgmma.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/primitives/cuda_check.cuh"
#include "kernels/dispatch/dispatch.h"
#include "kernels/attention/dflash_attention.cuh"
#include "kernels/primitives/mma.cuh"
#include "kernels/primitives/pdl.cuh"
#include "kernels/train_launchers.cuh"
#include "kernels/primitives/wgmma_tiles.cuh"

namespace df {

namespace {

using namespace dfa;

// ---- kernels ----------------------------------------------------------------------------------------
// 4-byte cp.async (zero-filled when !in), complete at the next tile_wait.
__device__ __forceinline__ void copy4(float* dst, const float* src, bool in) {
  const uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(to), "l"(src), "r"(in ? 4 : 0));
}

// Key-major dk/dv, each warp on 16 keys of the CTA's tile. Large form: 8 warps, 128 keys at hd ≤ 128; at hd
// 256 the tile is 64 keys and warp pairs split the head columns of dk/dv (128 accumulator columns of each per
// thread at most, so nothing spills); items of 64-row query chunks. Small form (SMALL: hd 128 and 256, whose
// large forms ask 153136 and 216624 bytes), to fit kSmallSmem: half the keys and half (hd 128) or a quarter
// (hd 256) of the chunk rows, so 4 warps. Each warp's products keep the large form's shapes (16 keys × 128
// accumulator columns, the same query rows a step), no product is computed twice, and the Q/dO chunks stay
// double-buffered; the cost is more items (barriers) per key and twice the Q/dO reads (from L2) per key.
template <int HD, bool SMALL>
struct KvCfg {
  static constexpr int kSplit = HD > 128 ? 2 : 1;
  static constexpr int kKeys = (SMALL ? 64 : 128) / kSplit;
  static constexpr int kThreads = 2 * kKeys * kSplit;                  // a warp per 16 keys and column share
  static constexpr int kChunk = SMALL ? kTile / (2 * kSplit) : kTile;  // query rows of an item
  static constexpr int kCols = HD / kSplit;
  static constexpr int kQStep = HD > 128 ? 16 : 32;  // query rows per step of a warp (32 spills at hd 256)
  static constexpr int kScanK = 4;                   // blocks each thread tests per round of the scan
  static constexpr size_t kPartBytes = sizeof(float) * 2 * kKeys * HD;  // one rank's dk, dv partial
  static_assert(kChunk % kQStep == 0 && kThreads >= kChunk, "whole steps; one thread a query row of an item");
};

// The CTAs of a cluster sharing one tile's items (RANKS: dflash_attention_kv_ranks_choose, kWgRanks): this
// CTA's rank, the cluster's barrier, and rank q's partial as seen from here. RANKS 1 is a plain launch (GPUs
// without clusters): rank 0, a block barrier, the CTA's own partial. The cluster calls compile only for
// compute 9.0 and later, where dispatch launches clusters; elsewhere they trap.
template <int RANKS>
__device__ __forceinline__ int kv_rank() {
  if constexpr (RANKS == 1) {
    return 0;
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap();
    return 0;
#else
    return int(cooperative_groups::this_cluster().block_rank());
#endif
  }
}

template <int RANKS>
__device__ __forceinline__ void kv_sync() {
  if constexpr (RANKS == 1) {
    __syncthreads();
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap();
#else
    cooperative_groups::this_cluster().sync();
#endif
  }
}

template <int RANKS>
__device__ __forceinline__ const float* kv_partial(float* part, int q) {
  if constexpr (RANKS == 1) {
    return part;
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap();
    return part;
#else
    return cooperative_groups::this_cluster().map_shared_rank(part, q);
#endif
  }
}
// The mma.sync kernel's clusters where the device has them (dflash_attention_kv_ranks_choose).
constexpr int kMmaRanks = 4;
// The wgmma kernel's clusters: 2 CTAs, as clusters of 4 one-CTA SMs pack only 120 of the H200's 132 SMs
// (Nsight Compute), which makes the pass about a tenth slower than with 2.
constexpr int kWgRanks = 2;

// One cluster of RANKS CTAs (dflash_attention_kv_ranks_choose, kWgRanks; 1: no cluster) per (kKeys absolute
// k/v rows, kv head). Each CTA lists, in block order, the blocks that see any of its keys (kScanK·THREADS
// entries of `blocks` at a time, their masks kept in shared memory); of the list's items (block, query chunk
// of kChunk rows) rank r takes the r-th contiguous share, so a tile that every block sees (the start of a
// long context) is spread over RANKS SMs. Per item it loads the chunk's query rows with their row terms (the
// next item's copies fly during this one): Sᵀ = K·Qᵀ, Pᵀ from the lse, dV += Pᵀ·dO, dSᵀ = Pᵀ∘(V·dOᵀ − D), dK
// += dSᵀ·Q. The ranks' f32 partials are then summed through distributed shared memory in rank order and each
// dk/dv row written once: deterministic, no atomics. WG (hd 128 only): each warpgroup owns 64 of the 128 keys
// and runs the four products of an item on wgmma (Sᵀ and dPᵀ from swizzled tiles, Pᵀ and dSᵀ as register
// operands). TMA (WG, a group of at most 64 query rows): thread 0 streams an item's Q and dO as one 3-d box
// per 64-column half (tm_q, tm_do: the group's heads of the block's rows), which orders the chunk's rows
// token-major (row r is token r / group of head r % group); rows past the group keep the zeros the buffers
// start with, and an item's dK product stays in flight into the next item's scores, Q/dO in three buffers
// (the last item's Q is still read). Without TMA the wgmma kernel loads Q and dO as one pass over their
// shared rows. An item that sees all of a warpgroup's keys skips the mask.
// The grid's order: the clusters start in block-index order and their work differs by far (a tile at the
// start of a sequence is seen by every block whose window reaches it, an own-row tile by its own blocks), so
// by default (blockIdx.x the tile) each kv head's longest tiles start after every tile of the heads before it
// and the last head's run on while the rest of the GPU idles; with head_group n (blockIdx.x the kv head in a
// group of n, blockIdx.y the tile, blockIdx.z / RANKS the group) each tile's clusters of a group's heads
// start together, the group's context tiles before its own-row ones: n = hkv is the whole grid in tile order,
// a smaller n keeps fewer heads' Q and dO among the clusters that run together (L2). overlap: the dq pass is
// launched after this kernel with programmatic dependent launch and needs nothing it writes, so every CTA
// lets it start at once: its CTAs take the SMs this grid's last clusters leave free (each waits at its end
// for this grid to end, dfa_query_kernel).
template <int HD, bool WG, int RANKS, bool TMA, bool SMALL>
__global__ void __launch_bounds__(KvCfg<HD, SMALL>::kThreads, 1)
    dfa_kv_kernel(KvArgs p, const __grid_constant__ CUtensorMap tm_q,
                  const __grid_constant__ CUtensorMap tm_do) {
  using Cfg = KvCfg<HD, SMALL>;
  static_assert(!WG || (HD == 128 && !SMALL && Cfg::kKeys == 128 && Cfg::kThreads == 256),
                "the wgmma variant: head dim 128, two warpgroups of 64 keys");
  static_assert(!TMA || WG, "the TMA loads fill wgmma tiles");
  constexpr int NB = TMA ? 3 : 2;  // Q/dO buffers
  constexpr int LDS = HD + 8, THREADS = Cfg::kThreads, COLS = Cfg::kCols, KEYS = Cfg::kKeys;
  constexpr int QC = Cfg::kChunk, SLICES = KEYS / 16, LIST = Cfg::kScanK * THREADS;
  constexpr int KVT = WG ? KEYS / 64 * kWgTile : int(sizeof(bf16)) * KEYS * LDS;  // bytes of the K or V tile
  constexpr int QT = WG ? kWgTile : int(sizeof(bf16)) * QC * LDS;  // bytes of one Q or dO chunk
  extern __shared__ __align__(16) unsigned char dfa_smem[];
  unsigned char* const tiles = WG ? align1024(dfa_smem) : dfa_smem;
  unsigned char* const Kt = tiles;
  unsigned char* const Vt = Kt + KVT;
  // Q and dO of NB query chunks: the next one loads during this one.
  unsigned char* const QdO = Vt + KVT;
  auto Qb = [&](int b) { return QdO + 2 * b * QT; };
  auto dOb = [&](int b) { return QdO + (2 * b + 1) * QT; };
  float* lse2 = reinterpret_cast<float*>(QdO + 2 * NB * QT);  // [2][QC] per chunk row: lse·log2 e,
  float* dsum = lse2 + 2 * QC;                                // D,
  int* cols = reinterpret_cast<int*>(dsum + 2 * QC);          // first context key | end of own keys << 16
  int2* meta = reinterpret_cast<int2*>(cols + 2 * QC);        // listed blocks' (first row, anchor)
  int* list = reinterpret_cast<int*>(meta + LIST);
  int* wcount = list + LIST;
  // Per Q/dO buffer, from warps 0 and 1 (query rows 0-31, 32-63): bit w set when every one of its rows sees
  // all 64 keys of warpgroup w's half of the tile, so that warpgroup forms Pᵀ without the mask (WG only).
  unsigned* fullw = reinterpret_cast<unsigned*>(wcount + THREADS / 32);
  const uint32_t bars = static_cast<uint32_t>(__cvta_generic_to_shared(fullw + 4));  // TMA: per Q/dO buffer
  const DFlashAttnDims& d = p.d;
  if (p.overlap) pdl_launch_dependents();
  const int64_t tile = p.head_group ? blockIdx.y : blockIdx.x;
  const int64_t rows = p.rows, r0 = tile * KEYS, r1 = min(r0 + KEYS, rows);
  const int g = p.head_group ? int(blockIdx.z / RANKS) * p.head_group + int(blockIdx.x) : int(blockIdx.y),
            group = d.hq / d.hkv, R = group * d.block, nz = (R + QC - 1) / QC;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, gr = lane >> 2, t4 = lane & 3;
  const int kw = (warp % SLICES) * 16, col0 = (warp / SLICES) * COLS;  // this warp's key rows and columns
  const int rank = kv_rank<RANKS>();

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
  // TMA: the Q/dO buffers' phases (bit b flips at each wait on buffer b).
  unsigned phase = 0;
  auto wait = [&](int tb) {
    if constexpr (WG)
      tile_wait_wg();
    else
      tile_wait();
    if constexpr (TMA) {
      mbar_wait(bars + 8 * tb, (phase >> tb) & 1u);
      phase ^= 1u << tb;
    }
  };
  if constexpr (TMA) {
    // Zeros in the Q/dO buffers (rows past the group are never loaded), published to the async proxy before
    // the first bulk copy.
    for (int i = threadIdx.x; i < 2 * NB * QT / 16; i += THREADS)
      reinterpret_cast<uint4*>(QdO)[i] = make_uint4(0u, 0u, 0u, 0u);
    if (threadIdx.x == 0) {
      for (int i = 0; i < NB; ++i) mbar_init(bars + 8 * i, 1);
      DF_SM90_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    DF_SM90_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
  }
  load(Kt, std::integral_constant<int, KEYS>{}, kvsrc(p.k, p.ld_k));
  load(Vt, std::integral_constant<int, KEYS>{}, kvsrc(p.v, p.ld_v));

  // dk, dv of this thread's keys: per warp 16 keys × COLS as mma.sync n-tiles, or per warpgroup the wgmma
  // m64n128 fragment (the same element order: acc[i] of the flat one is acc[i / 4][i % 4]).
  std::conditional_t<WG, float[64], float[COLS / 8][4]> dk, dv;
  // The wgmma variant's Pᵀ and dSᵀ as A fragments: live until the products reading them are waited for.
  uint32_t pa[4][4] = {}, da[4][4] = {};
  auto fence_frags = [&] {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      wgmma_fence_regs(pa[k]);
      wgmma_fence_regs(da[k]);
    }
  };
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

    // Items of this round: item n is (listed block n / nz, query chunk n % nz), nz 1 unless a group has more
    // than QC query rows; row terms double-buffered, Q/dO in NB buffers.
    auto split_item = [nz](int n) { return nz == 1 ? make_int2(n, 0) : make_int2(n / nz, n % nz); };
    // Item n's row terms into buffer b, its Q and dO into tile buffer tb.
    auto load_item = [&](int n, int b, int tb) {
      const int2 it = split_item(n);
      const int64_t j = base + list[it.x];
      const int z0 = it.y * QC;
      const int2 sj = meta[it.x];
      const BlockMask m{sj.x, sj.y, d.T + j * d.block, d.block, d.window};
      if (threadIdx.x < QC) {
        // Chunk row r: group row rr = head·block + token (TMA: token r / group of head r % group).
        const int r = threadIdx.x;
        const int rr = TMA ? r % group * d.block + r / group : z0 + r;
        const int kq = TMA ? r / group : row_split(rr, d.block, p.blk_magic).y;
        const bool in = TMA ? r < R : rr < R;
        const int64_t at = (j * d.hq + int64_t(g) * group) * d.block + (in ? rr : 0);
        // A row past the group sees nothing: an empty context range and an empty own range.
        const int lo = in ? rel(m.s0 + m.lo(kq)) : KEYS + 1;
        const int hi = in ? rel(m.bj + (d.window > 0 ? kq + 1 : d.block)) : -1;
        cols[b * QC + r] = int((uint32_t(lo) & 0xffffu) | (uint32_t(hi) << 16));
        copy4(lse2 + b * QC + r, p.lse2 + at, in);
        copy4(dsum + b * QC + r, p.dsum + at, in);
        if constexpr (WG) {
          const int ctx_hi = rel(m.s0 + m.a), own_lo = rel(m.bj);
          auto covers = [&](int x0) {  // keys [x0, x0 + 64) all in this row's context range or all in its own
            return in && ((lo <= x0 && ctx_hi >= x0 + 64) || (own_lo <= x0 && hi >= x0 + 64));
          };
          const unsigned f0 = __all_sync(0xffffffffu, covers(0)), f1 = __all_sync(0xffffffffu, covers(64));
          if (lane == 0) fullw[2 * b + warp] = f0 | f1 << 1;
        }
      }
      // Query row rr of the chunk list is token rr % block of head rr / block of the group.
      auto qsrc = [&](const bf16* src, int64_t ld) {
        return [=](int r) -> const bf16* {
          const int rr = z0 + r;
          const int2 hk = row_split(rr, d.block, p.blk_magic);
          return rr < R ? src + (j * d.block + hk.y) * ld + int64_t(g * group + hk.x) * d.hd : nullptr;
        };
      };
      if constexpr (TMA) {
        if (threadIdx.x == 0) {  // the group's heads of rows j·block.. as one box per 64 columns
          const uint32_t bar = bars + 8 * tb, half = 64 * 128;
          const uint32_t q_s = static_cast<uint32_t>(__cvta_generic_to_shared(Qb(tb)));
          const uint32_t do_s = static_cast<uint32_t>(__cvta_generic_to_shared(dOb(tb)));
          mbar_arrive_expect(bar, uint32_t(R) * 128 * 2 * 2);
          for (int h = 0; h < 2; ++h) {
            tma_load_box3(q_s + h * half, &tm_q, 64 * h, g * group, int(j * d.block), bar);
            tma_load_box3(do_s + h * half, &tm_do, 64 * h, g * group, int(j * d.block), bar);
          }
        }
      } else if (WG) {
        load_tile_pair_wg<kTile, THREADS>(Qb(tb), p.q, p.ld_q, dOb(tb), p.dout, p.ld_dout, hd, [&](int r) {
          const int rr = z0 + r;
          const int2 hk = row_split(rr, d.block, p.blk_magic);
          return RowAt{rr < R ? j * d.block + hk.y : -1, int64_t(g * group + hk.x) * d.hd};
        });
      } else {
        load(Qb(tb), std::integral_constant<int, QC>{}, qsrc(p.q, p.ld_q));
        load(dOb(tb), std::integral_constant<int, QC>{}, qsrc(p.dout, p.ld_dout));
      }
    };
    const int items = total * nz, n0 = items * rank / RANKS, n1 = items * (rank + 1) / RANKS;
    if (n0 < n1) load_item(n0, 0, 0);
    for (int n = n0; n < n1; ++n) {
      const int b = (n - n0) & 1, tb = TMA ? (n - n0) % NB : b;
      wait(tb);  // item n (and K/V) landed; every warp is past item n − 1 (its buffers can be refilled)
      // The next item's copies fly during this one (issued after this item's products or its scores instead,
      // the wgmma pass is slower).
      if (n + 1 < n1) load_item(n + 1, b ^ 1, TMA ? (n + 1 - n0) % NB : b ^ 1);
      const int2 it = split_item(n);
      const int64_t j = base + list[it.x];
      const int z0 = it.y * QC;
      const int2 sj = meta[it.x];
      const BlockMask m{sj.x, sj.y, d.T + j * d.block, d.block, d.window};
      const int ctx_hi = rel(m.s0 + m.a), own_lo = rel(m.bj);
      const int* cb = cols + b * QC;
      const float *lb = lse2 + b * QC, *db = dsum + b * QC;
      // Pᵀ and dSᵀ of NQ 8-column n-tiles (query columns c0 + 8·n2 + 2·t4 + {0, 1}) for key rows xa (elements
      // 0, 1 of an n-tile) and xa + 8 (elements 2, 3), masked pairs 0: element e of n-tile n2 is S(n2, e),
      // Sᵀ that becomes Pᵀ, and DP(n2, e), dPᵀ that becomes dSᵀ.
      // With with_ds false only Pᵀ is formed (the wgmma variant forms dSᵀ later, from Pᵀ, the masked pairs
      // 0); with all_seen true every pair is visible (fullw), and the mask is not evaluated.
      auto p_ds = [&](auto nq, int c0, int xa, auto&& S, auto&& DP, auto with_ds, auto all_seen) {
#pragma unroll
        for (int n2 = 0; n2 < decltype(nq)::value; ++n2) {
          const int c = c0 + n2 * 8 + 2 * t4;  // the two query columns c, c + 1 of this thread
          const int2 v2 = *reinterpret_cast<const int2*>(cb + c);
          const float2 l2 = *reinterpret_cast<const float2*>(lb + c),
                       ds = *reinterpret_cast<const float2*>(db + c);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int v = e & 1 ? v2.y : v2.x, x = e < 2 ? xa : xa + 8;
            const bool vis = decltype(all_seen)::value || (x >= int(short(v)) && x < ctx_hi) ||
                             (x >= own_lo && x < (v >> 16));
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
        if (!m.sees(r0 + 64 * wg, r0 + 64 * wg + 64)) {
          if constexpr (TMA) {  // the previous item's products finish: its Q/dO buffer is refilled next
            wgmma_wait<0>();
            wgmma_fence_regs(dv);
            wgmma_fence_regs(dk);
            fence_frags();
          }
          continue;
        }
        // Four groups in flight at most two at a time: Pᵀ is formed while dPᵀ runs, dSᵀ while dV += Pᵀ·dO
        // runs (TMA: the previous item's dK runs into this item's scores).
        float s[32], dp[32];
        wg_issue_scores(s, Kt + wg * kWgTile, Qb(tb), dp, Vt + wg * kWgTile, dOb(tb));
        wg_wait<1>(s);
        if constexpr (TMA) {  // the previous item's dK is done with its fragments
          wgmma_fence_regs(dv);
          wgmma_fence_regs(dk);
          fence_frags();
        }
        auto sf = [&](int n2, int e) -> float& { return s[4 * n2 + e]; };
        auto dpf = [&](int n2, int e) -> float& { return dp[4 * n2 + e]; };
        if ((fullw[2 * b] & fullw[2 * b + 1]) >> wg & 1u)
          p_ds(std::integral_constant<int, 8>{}, 0, kw + gr, sf, dpf, std::false_type{}, std::true_type{});
        else
          p_ds(std::integral_constant<int, 8>{}, 0, kw + gr, sf, dpf, std::false_type{}, std::false_type{});
        wg_a_frags(s, pa);
        wg_issue_product(dv, pa, dOb(tb));
        wg_wait<1>(dp);
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const float2 ds = *reinterpret_cast<const float2*>(db + 8 * (i >> 2) + 2 * t4);
          dp[i] = s[i] * (dp[i] - (i & 1 ? ds.y : ds.x));
        }
        wg_a_frags(dp, da);
        wg_issue_product(dk, da, Qb(tb));
        if constexpr (TMA) {  // dV done, dK left in flight (only its fragments stay live into the next item)
          wg_wait<1>(dv);
#pragma unroll
          for (int k = 0; k < 4; ++k) wgmma_fence_regs(pa[k]);
        } else {
          wg_wait<0>(dv);
          wgmma_fence_regs(dk);
          fence_frags();
        }
      } else {
        // A warp whose 16 keys this block cannot see (tile edges, own rows of other blocks) skips the products.
        if (!m.sees(r0 + kw, r0 + kw + 16)) continue;
        const bf16 *Ks = reinterpret_cast<const bf16*>(Kt), *Vs = reinterpret_cast<const bf16*>(Vt);
        const bf16 *Qs = reinterpret_cast<const bf16*>(Qb(tb)), *dOs = reinterpret_cast<const bf16*>(dOb(tb));
        // QS query rows per step: QS / 8 independent accumulators per product keep the tensor pipes busy.
        constexpr int QS = Cfg::kQStep, NQ = QS / 8;
#pragma unroll 1
        for (int sub = 0; sub < QC / QS && z0 + sub * QS < R; ++sub) {
          const bf16 *qs = Qs + sub * QS * LDS, *dos = dOs + sub * QS * LDS;
          float s[NQ][4], dp[NQ][4];
          warp_mma_abt<NQ, HD, LDS>(s, Ks + kw * LDS, qs, lane);
          warp_mma_abt<NQ, HD, LDS>(dp, Vs + kw * LDS, dos, lane);
          p_ds(
              std::integral_constant<int, NQ>{}, sub * QS, kw + gr,
              [&](int n2, int e) -> float& { return s[n2][e]; },
              [&](int n2, int e) -> float& { return dp[n2][e]; }, std::true_type{}, std::false_type{});
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
    if constexpr (TMA) {  // the round's last products finish before the next round refills buffer 0
      wgmma_wait<0>();
      wgmma_fence_regs(dv);
      wgmma_fence_regs(dk);
      fence_frags();
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
  kv_sync<RANKS>();
  // Rank r sums rows [r·KEYS/RANKS, (r + 1)·KEYS/RANKS) over the ranks, in rank order.
  constexpr int RROWS = KEYS / RANKS;
  const float scale = d.scale;
  for (int c = threadIdx.x; c < RROWS * HD / 2; c += THREADS) {
    const int row = rank * RROWS + 2 * c / HD, col = 2 * c % HD, at = row * HD + col;
    float2 sk = make_float2(0.0f, 0.0f), sv = sk;
#pragma unroll
    for (int q = 0; q < RANKS; ++q) {
      const float* rp = kv_partial<RANKS>(part, q);
      const float2 a = *reinterpret_cast<const float2*>(rp + at),
                   b = *reinterpret_cast<const float2*>(rp + KEYS * HD + at);
      sk.x += a.x, sk.y += a.y, sv.x += b.x, sv.y += b.y;
    }
    const int64_t t = r0 + row;
    if (t >= rows) continue;
    store_two(p.dk + t * p.ld_dk + int64_t(g) * d.hd, col, d.hd, p.pairs, sk.x * scale, sk.y * scale);
    store_two(p.dv + t * p.ld_dv + int64_t(g) * d.hd, col, d.hd, p.pairs, sv.x, sv.y);
  }
  kv_sync<RANKS>();  // no CTA leaves while another still reads its partial
}

// ---- launchers --------------------------------------------------------------------------------------

// dfa_kv_kernel's shared memory: K and V, NB Q/dO chunks, their row terms, the scan's list, or the partial.
template <int HD, bool WG, bool TMA, bool SMALL>
constexpr size_t kv_smem() {
  using Cfg = KvCfg<HD, SMALL>;
  const size_t list = size_t(Cfg::kScanK) * Cfg::kThreads, chunk = Cfg::kChunk;
  const size_t tiles = WG ? size_t(2 * Cfg::kKeys / 64 + (TMA ? 6 : 4)) * kWgTile
                          : sizeof(bf16) * (2 * Cfg::kKeys + 4 * chunk) * (HD + 8);
  return (WG ? 1024 : 0) +
         std::max(Cfg::kPartBytes, tiles + sizeof(float) * 4 * chunk + sizeof(int) * 2 * chunk +
                                       (sizeof(int2) + sizeof(int)) * list +
                                       sizeof(int) * Cfg::kThreads / 32 + sizeof(unsigned) * 4 +
                                       (TMA ? sizeof(uint64_t) * 3 : 0));
}
// The head dims whose large form asks more than kSmallSmem have a small form (kv_pass_launch).
constexpr bool kv_has_small(int hd) {
  return hd >= 128;
}
static_assert(kv_smem<64, false, false, false>() <= kSmallSmem &&
                  kv_smem<128, false, false, true>() <= kSmallSmem &&
                  kv_smem<256, false, false, true>() <= kSmallSmem,
              "every head dim has a form that fits kSmallSmem");

template <int HD, bool WG, int RANKS, bool TMA, bool SMALL>
void kv_pass(const KvArgs& a, cudaStream_t stream) {
  using Cfg = KvCfg<HD, SMALL>;
  constexpr size_t smem = kv_smem<HD, WG, TMA, SMALL>();
  kernel_smem_opt_in(reinterpret_cast<const void*>(dfa_kv_kernel<HD, WG, RANKS, TMA, SMALL>), smem,
                     "dfa_kv_kernel");
  const int64_t key_tiles = (a.rows + Cfg::kKeys - 1) / Cfg::kKeys;
  KvArgs b = a;
  // grid.y's and grid.z's limits, and whole groups; the default order otherwise
  const int n = a.head_group;
  b.head_group = n > 0 && a.d.hkv % n == 0 && key_tiles <= 65535 && a.d.hkv / n * RANKS <= 65535 ? n : 0;
  const dim3 grid = b.head_group ? dim3(unsigned(n), unsigned(key_tiles), unsigned(a.d.hkv / n * RANKS))
                                 : dim3(unsigned(key_tiles), unsigned(a.d.hkv), unsigned(RANKS));
  CUtensorMap tm_q{}, tm_do{};
  if constexpr (TMA) {  // one box: a block's rows of one kv head's group of query heads, 64 columns
    const int group = a.d.hq / a.d.hkv;
    tm_q = tensor_map_bf16_heads(a.q, a.d.nb * a.d.block, a.d.hq, a.d.hd, a.ld_q, group, a.d.block);
    tm_do = tensor_map_bf16_heads(a.dout, a.d.nb * a.d.block, a.d.hq, a.d.hd, a.ld_dout, group, a.d.block);
  }
  // A cluster of RANKS CTAs along grid.z; RANKS 1: a plain launch, for GPUs without clusters.
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = unsigned(RANKS);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(Cfg::kThreads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = RANKS > 1 ? 1 : 0;
  DF_CUDA_CHECK(cudaLaunchKernelEx(&cfg, dfa_kv_kernel<HD, WG, RANKS, TMA, SMALL>, b, tm_q, tm_do));
}

}  // namespace

void dfa::kv_pass_launch(const KvArgs& a, bool wg, cudaStream_t stream) {
  if (a.rows == 0) return;
  if (wg && a.tma) {
    kv_pass<128, true, kWgRanks, true, false>(a, stream);
    return;
  }
  if (wg) {
    kv_pass<128, true, kWgRanks, false, false>(a, stream);
    return;
  }
  // The mma.sync kernel in the form and cluster size dispatch picks for the device.
  const DeviceCaps& caps = device_caps();
  const bool clusters = dflash_attention_kv_ranks_choose(caps) == kMmaRanks;
  dispatch_head_dim(a.d.hd, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    constexpr bool S = kv_has_small(HD);
    const bool small =
        S && dflash_attention_form_choose(caps, kernel_variants(), kv_smem<HD, false, false, false>()) ==
                 DFlashAttnForm::small;
    if (small && clusters)
      kv_pass<HD, false, kMmaRanks, false, S>(a, stream);
    else if (small)
      kv_pass<HD, false, 1, false, S>(a, stream);
    else if (clusters)
      kv_pass<HD, false, kMmaRanks, false, false>(a, stream);
    else
      kv_pass<HD, false, 1, false, false>(a, stream);
  });
}

}  // namespace df
