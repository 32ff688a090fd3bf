// Incremental decoding's fast attention (kernels/decode/decode.cuh; decode.cu has the launchers and the
// general kernels, decode_gdn.cu the fast DeltaNet decode, decode_plan.cu how a step is split): attention
// over a cache split over key chunks on tensor cores with a merge kernel, both launched with programmatic
// dependent launch (pdl.cuh).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <mutex>

#include "kernels/decode/decode.cuh"
#include "kernels/launchers.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/primitives/mma.cuh"
#include "kernels/primitives/pdl.cuh"

namespace df {

namespace {

// ---- split-KV attention over a cache on tensor cores -----------------------------------------------------
// Rows of a kv head's work: r = t·group + g is token t of query head kvh·group + g, so all rows of a CTA read
// the same K / V. A CTA takes a group of cta_rows <= kSplitMaxRows of them (attention_split_plan,
// decode_plan.h, picks the groups), one m16 tile per warp (HALVES 1) or per pair of warps (HALVES 2), and
// `slices` warps (pairs) per tile that share the key stages: a stage is slices × WK keys (WK =
// split_warp_keys(HALVES)) and warp (tile, slice) runs its own online softmax over its WK of them, so a step
// with few tiles still has up to kSplitMaxWarps warps on the tensor cores while the copies of the next stages
// are in flight. The slices of a tile are merged in shared memory at the end, so a CTA writes one partial per
// row. HALVES 2 is the verify step's path at hd 256 (T 16: 6 tiles, so HALVES 1 leaves one slice and 6 warps
// an SM, each running a long serial chain per stage with an hd-256 accumulator): the two warps of a pair each
// take half of Q·Kᵀ's head dim and add their partial scores through shared memory, run the same softmax on
// the same sums, and each computes P·V for its half of the output columns, so a warp's chain per stage and
// its accumulator are half as long and twice the warps fit.
constexpr int kMergeThreads = 256;

// cp_async_wait with the count known at run time (the stage count is the launcher's choice), n <= 5.
__device__ __forceinline__ void cp_async_wait_n(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    default: cp_async_wait<5>(); break;
  }
}

// Keys [kb, kb + keys) of kv head kvh's K and V into a ring slot (K rows [keys][HD + 8], then V rows), copied
// by the CTA's threads; keys past the cache (len rows) read its last row: finite values that the mask gives
// weight 0. A thread keeps one 16-byte column piece of rows r, r + step, ... (blockDim is whole warps and
// HD / 8 divides 32), so no copy divides an index at run time: a flat loop over (row, piece) would divide by
// the stage's keys per copy, and at T 1 each warp's chain of instructions is what the step waits for.
template <int HD>
__device__ __forceinline__ void split_copy_stage(bf16* slot, const bf16* __restrict__ k, int64_t ld_k,
                                                 const bf16* __restrict__ v, int64_t ld_v, int kvh,
                                                 int64_t kb, int keys, int64_t len) {
  constexpr int LDS = HD + 8, CH = HD / 8;
  static_assert(32 % CH == 0, "a thread's copies keep one column piece: CH must divide a warp");
  const int col = (threadIdx.x % CH) * 8, step = blockDim.x / CH;
  const bf16* kcol = k + (int64_t)kvh * HD + col;
  const bf16* vcol = v + (int64_t)kvh * HD + col;
  bf16* dst = slot + col;
  for (int r = threadIdx.x / CH; r < keys; r += step) {
    const int64_t j = min(kb + r, len - 1);
    cp_async_16(dst + r * LDS, kcol + j * ld_k, 16);
    cp_async_16(dst + (keys + r) * LDS, vcol + j * ld_v, 16);
  }
}

// Block (chunk, kvh, z): keys [chunk·chunk_len, +chunk_len) of the cache against rows [z·cta_rows, +cta_rows)
// of kv head kvh, stopping at the last key those rows see (a chunk wholly past it writes m = −inf, l = 0).
// blockDim is 32 · wtiles · HALVES · slices; `stages` ring buffers of slices · WK keys (chunk_len a multiple
// of that), WK = split_warp_keys(HALVES) keys a warp a stage. Scores and the softmax in fp32 (log2 domain:
// scale_log2 = scale·log2 e); P enters P·V split into bf16 hi + lo, so its weights keep 16 mantissa bits (a
// plain bf16 P would cost 2^-9 relative per key, far above the decode's fp32 contract). Writes the chunk's
// unnormalised acc [rows][HD] to part and (max, sum) per row to part_ml.
template <int HD, int HALVES>
__global__ void __launch_bounds__(32 * split_max_warps(HD, HALVES))
    attention_split_kernel(const bf16* __restrict__ q, int64_t ld_q, const bf16* __restrict__ k, int64_t ld_k,
                           const bf16* __restrict__ v, int64_t ld_v, float* __restrict__ part,
                           float* __restrict__ part_ml, int64_t past, int T, int group, int cta_rows,
                           int chunk_len, int slices, int stages, float scale_log2) {
  // HW: the head-dim columns a warp multiplies and writes; CH: 16-byte pieces of a row
  // KN: 8-key n-tiles of a warp's scores; SLOT: floats of a pair's score slot per warp
  constexpr int WK = split_warp_keys(HALVES), LDS = HD + 8, HW = HD / HALVES, NT = HW / 8, CH = HD / 8,
                KN = WK / 8, SLOT = 128 * KN;
  extern __shared__ __align__(16) unsigned char split_smem[];
  const int rows = T * group, r0 = blockIdx.z * cta_rows, here = min(cta_rows, rows - r0);
  const int chunk = blockIdx.x, chunks = gridDim.x, kvh = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // A slice's warps: wtiles tiles × HALVES column halves, warp tc + wslice·slice, tc = tile + wtiles·half.
  const int wslice = blockDim.x / 32 / slices, wtiles = wslice / HALVES, tc = warp % wslice,
            slice = warp / wslice;
  const int tile = HALVES == 1 ? tc : tc % wtiles, half = HALVES == 1 ? 0 : tc / wtiles;
  const int stage_keys = slices * WK;
  const int64_t len = past + T, key0 = (int64_t)chunk * chunk_len;
  const int64_t seen = past + (r0 + here - 1) / group + 1;  // keys [0, seen) are visible to some row here
  const int nb = (int)((max((int64_t)0, min(key0 + chunk_len, seen) - key0) + stage_keys - 1) / stage_keys);
  bf16* sq = reinterpret_cast<bf16*>(split_smem);  // [wtiles·16][LDS], rows past `here` zero
  // HALVES 2: each warp's partial scores [4·KN][32 lanes] for its pair; then the ring of stages: K
  // [stage_keys][LDS] then V
  float* sx = reinterpret_cast<float*>(sq + wtiles * 16 * LDS);
  bf16* skv = reinterpret_cast<bf16*>(sx + (HALVES > 1 ? wslice * slices * SLOT : 0));
  pdl_wait();  // q, k, v come from the previous kernels; the partials may still be read by the last merge
  pdl_launch_dependents();
  for (int i = threadIdx.x; i < wtiles * 16 * CH; i += blockDim.x) {
    const int r = i / CH, d = (i % CH) * 8, rg = r0 + r;
    const bool in = r < here;
    const bf16* src = in ? q + (int64_t)(rg / group) * ld_q + (int64_t)(kvh * group + rg % group) * HD + d : q;
    cp_async_16(sq + r * LDS + d, src, in ? 16 : 0);
  }
  cp_async_commit();
  // Key stage b of the chunk into ring slot b % stages (split_copy_stage).
  auto load_stage = [&](int b) {
    split_copy_stage<HD>(skv + (b % stages) * 2 * stage_keys * LDS, k, ld_k, v, ld_v, kvh,
                         key0 + (int64_t)b * stage_keys, stage_keys, len);
  };
  for (int b = 0; b < stages - 1; ++b) {
    if (b < nb) load_stage(b);
    cp_async_commit();  // empty groups too: the wait below counts groups
  }

  const bool active = tile * 16 < here;
  // This lane's rows (g and g + 8 of the warp's tile; r_lo, r_hi of the kv head's) see keys up to past + their
  // token; padding rows none.
  const int r_lo = r0 + tile * 16 + (lane >> 2), r_hi = r_lo + 8;
  const bool in_lo = r_lo < r0 + here, in_hi = r_hi < r0 + here;
  const int64_t lim_lo = in_lo ? past + r_lo / group : -1, lim_hi = in_hi ? past + r_hi / group : -1;
  float acc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;  // l: this lane's columns only
  for (int b = 0; b < nb; ++b) {
    if (b + stages - 1 < nb) load_stage(b + stages - 1);
    cp_async_commit();
    cp_async_wait_n(stages - 1);  // Q and stage b have landed (this thread's copies)
    __syncthreads();              // ... and every thread's
    if (active) {
      const bf16* sk = skv + (b % stages) * 2 * stage_keys * LDS + slice * WK * LDS;
      float s[KN][4];
      warp_mma_abt<KN, HW, LDS>(s, sq + tile * 16 * LDS + half * HW, sk + half * HW, lane);
      if constexpr (HALVES > 1) {
        // The pair's two halves of the dot products, added as mine + the other's: fp32 addition commutes, so
        // both warps hold the same bits and their softmax statistics agree exactly. The other's slot is not
        // rewritten before the barrier at the end of this stage.
        const int other = warp + (half ? -wtiles : wtiles);
#pragma unroll
        for (int i = 0; i < 4 * KN; ++i) sx[warp * SLOT + i * 32 + lane] = s[i / 4][i % 4];
        named_bar_sync(1 + tile + wtiles * slice, 64);
#pragma unroll
        for (int i = 0; i < 4 * KN; ++i) s[i / 4][i % 4] += sx[other * SLOT + i * 32 + lane];
      }
      const int64_t kb = key0 + (int64_t)b * stage_keys + slice * WK + 2 * (lane & 3);
      float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
      for (int n = 0; n < KN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t j = kb + n * 8 + (e & 1);
          const float x = j <= (e < 2 ? lim_lo : lim_hi) ? s[n][e] * scale_log2 : -INFINITY;
          s[n][e] = x;
          if (e < 2) mx_lo = fmaxf(mx_lo, x); else mx_hi = fmaxf(mx_hi, x);
        }
#pragma unroll
      for (int o = 1; o <= 2; o <<= 1) {  // the quad holds the row's WK keys of this warp
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, o));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, o));
      }
      const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
      // A row with no visible key so far keeps max −inf: subtracting 0 instead gives p = 0, not NaN.
      const float base_lo = mn_lo == -INFINITY ? 0.0f : mn_lo, base_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
      const float c_lo = exp2f(m_lo - base_lo), c_hi = exp2f(m_hi - base_hi);
      float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
      for (int n = 0; n < KN; ++n) {
        s[n][0] = exp2f(s[n][0] - base_lo);
        s[n][1] = exp2f(s[n][1] - base_lo);
        s[n][2] = exp2f(s[n][2] - base_hi);
        s[n][3] = exp2f(s[n][3] - base_hi);
        sum_lo += s[n][0] + s[n][1];
        sum_hi += s[n][2] + s[n][3];
      }
      l_lo = l_lo * c_lo + sum_lo;
      l_hi = l_hi * c_hi + sum_hi;
      m_lo = mn_lo;
      m_hi = mn_hi;
      scale_acc_rows(acc, c_lo, c_hi);
#pragma unroll
      for (int kk = 0; kk < WK / 16; ++kk) {  // P·V one 16-key k-step at a time
        uint32_t ah[4], al[4];
        acc_to_a_frag_split(s[2 * kk], s[2 * kk + 1], ah, al);
        warp_mma_ab_split<NT, LDS>(acc, ah, al, sk + (stage_keys + 16 * kk) * LDS + half * HW, lane);
      }
    }
    __syncthreads();  // ring slot b % stages (and the pairs' score slots) are refilled next iteration
  }
  cp_async_wait<0>();  // a CTA with no visible key (nb = 0) still has Q's copies in flight
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, o);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, o);
  }
  if (slices > 1) {
    // Merge the slices of each (tile, half): every warp puts its rows' (max, sum) in shared memory, takes the
    // tile's max M over the slices, rescales its acc by 2^(m − M) and leaves it there too; then each warp of
    // the tile adds the slices' acc, in slice order, for every slices-th 8-column n-tile and writes those
    // columns of the partial, so the adds are spread over the tile's warps rather than one warp adding the
    // others' in turn. A row of accw is HW + 8 floats: the rows of a float2 access fall in different banks.
    // The ring is free (the loop ended on a barrier; an nb = 0 CTA never filled it).
    constexpr int HWP = HW + 8;
    float* mlw = reinterpret_cast<float*>(skv);  // [warps][16][2]
    float* accw = mlw + blockDim.x;              // [warps][16][HWP]
    const int rl = lane >> 2;
    if ((lane & 3) == 0) {
      mlw[(warp * 16 + rl) * 2] = m_lo;
      mlw[(warp * 16 + rl) * 2 + 1] = l_lo;
      mlw[(warp * 16 + rl + 8) * 2] = m_hi;
      mlw[(warp * 16 + rl + 8) * 2 + 1] = l_hi;
    }
    __syncthreads();
    float M_lo = -INFINITY, M_hi = -INFINITY;
    for (int sl = 0; sl < slices; ++sl) {
      const int w = sl * wslice + tc;
      M_lo = fmaxf(M_lo, mlw[(w * 16 + rl) * 2]);
      M_hi = fmaxf(M_hi, mlw[(w * 16 + rl + 8) * 2]);
    }
    const float B_lo = M_lo == -INFINITY ? 0.0f : M_lo, B_hi = M_hi == -INFINITY ? 0.0f : M_hi;
    scale_acc_rows(acc, exp2f(m_lo - B_lo), exp2f(m_hi - B_hi));
    float* mine = accw + warp * 16 * HWP + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      *reinterpret_cast<float2*>(mine + rl * HWP + n * 8) = make_float2(acc[n][0], acc[n][1]);
      *reinterpret_cast<float2*>(mine + (rl + 8) * HWP + n * 8) = make_float2(acc[n][2], acc[n][3]);
    }
    float L_lo = 0.0f, L_hi = 0.0f;
    for (int sl = 0; sl < slices; ++sl) {
      const int w = sl * wslice + tc;
      L_lo += mlw[(w * 16 + rl) * 2 + 1] * exp2f(mlw[(w * 16 + rl) * 2] - B_lo);
      L_hi += mlw[(w * 16 + rl + 8) * 2 + 1] * exp2f(mlw[(w * 16 + rl + 8) * 2] - B_hi);
    }
    __syncthreads();
    if (!active) return;
    const int64_t unit = (int64_t)kvh * chunks + chunk;
    float* prow = part + unit * rows * HD + half * HW + 2 * (lane & 3);
    const float* tile_acc = accw + tc * 16 * HWP + 2 * (lane & 3);  // slice 0's warp of this (tile, half)
    for (int n = slice; n < NT; n += slices) {
      float2 lo = make_float2(0.0f, 0.0f), hi = lo;
      for (int sl = 0; sl < slices; ++sl) {
        const float* o = tile_acc + sl * wslice * 16 * HWP + n * 8;
        const float2 a = *reinterpret_cast<const float2*>(o + rl * HWP);
        const float2 c = *reinterpret_cast<const float2*>(o + (rl + 8) * HWP);
        lo.x += a.x;
        lo.y += a.y;
        hi.x += c.x;
        hi.y += c.y;
      }
      if (in_lo) *reinterpret_cast<float2*>(prow + (int64_t)r_lo * HD + n * 8) = lo;
      if (in_hi) *reinterpret_cast<float2*>(prow + (int64_t)r_hi * HD + n * 8) = hi;
    }
    if ((lane & 3) == 0 && half == 0 && slice == 0) {  // the pair's (m, l) are the same bits
      float* ml = part_ml + unit * rows * 2;
      if (in_lo) *reinterpret_cast<float2*>(ml + 2 * r_lo) = make_float2(M_lo, L_lo);
      if (in_hi) *reinterpret_cast<float2*>(ml + 2 * r_hi) = make_float2(M_hi, L_hi);
    }
    return;
  }
  if (!active) return;
  const int64_t unit = (int64_t)kvh * chunks + chunk;
  float* prow = part + unit * rows * HD + half * HW + 2 * (lane & 3);
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    if (in_lo) *reinterpret_cast<float2*>(prow + (int64_t)r_lo * HD + n * 8) = make_float2(acc[n][0], acc[n][1]);
    if (in_hi) *reinterpret_cast<float2*>(prow + (int64_t)r_hi * HD + n * 8) = make_float2(acc[n][2], acc[n][3]);
  }
  if ((lane & 3) == 0 && half == 0) {  // the pair's (m, l) are the same bits
    float* ml = part_ml + unit * rows * 2;
    if (in_lo) *reinterpret_cast<float2*>(ml + 2 * r_lo) = make_float2(m_lo, l_lo);
    if (in_hi) *reinterpret_cast<float2*>(ml + 2 * r_hi) = make_float2(m_hi, l_hi);
  }
}

// ---- split-KV attention for short steps: the transposed products -----------------------------------------
// A step of T·group <= 8 rows a kv head (T 1 at every Qwen shape) fills 6 or 4 of an m16 tile's 16 rows, so
// attention_split_kernel would spend most of its tensor work, and half its registers (a 16 × hd fp32 acc), on
// padding rows, its one warp a scheduler waiting on each MMA in turn. This kernel computes the transposed
// products, keys and head dims as the MMAs' M side and the rows as their 8-wide N side: Sᵀ = K·Qᵀ, then
// Oᵀ += Vᵀ·Pᵀ, so a warp's acc is hd × 8 (half the registers), a 16-key stage takes half the MMAs, and Q
// stays in registers as B fragments. Block (chunk, kvh): every row of kv head kvh against keys
// [chunk·chunk_len, +chunk_len); key slice s (a pair of warps: below) takes keys [16s, +16) of each stage of
// 16 · slices keys (a ring of `stages`, as attention_split_kernel) and runs its own online softmax over them.
// The C fragment of Sᵀ (lane (g, t): keys g and g + 8 of rows 2t, 2t + 1) becomes P's B fragment (rows g,
// keys 2t ..) by movmatrix, split into bf16 hi + lo as in attention_split_kernel. The warps' acc are merged
// through shared memory at the end, each CTA writing one partial per row (the layout attention_merge_kernel
// reads).
// A key slice is a pair of warps splitting the head dim: warp 2·slice + hpart takes columns [hpart·hd/2,
// +hd/2) of the slice's 16 keys. It multiplies only those (half of Q·Kᵀ's k-steps, of P·V's head-dim tiles
// and of acc), the pair adding its partial scores through shared memory (double-buffered by stage parity, a
// 64-thread named barrier a stage) so both run the same softmax on the same sums: twice the warps an SM for
// the same shared memory, which measured faster than one warp a slice at both Qwen shapes. The CTA's threads
// copy each stage together and meet at a barrier before and after it, as attention_split_kernel does.
template <int HD>
__global__ void __launch_bounds__(32 * split_tr_max_warps(HD))
    attention_split_tr_kernel(const bf16* __restrict__ q, int64_t ld_q, const bf16* __restrict__ k,
                              int64_t ld_k, const bf16* __restrict__ v, int64_t ld_v,
                              float* __restrict__ part, float* __restrict__ part_ml, int64_t past, int T,
                              int group, int chunk_len, int stages, float scale_log2) {
  // MT: 16-wide head-dim tiles; HDP: a merge row's floats (HD + 4: the 8 rows × 4 column groups a warp
  // instruction stores fall in 32 different banks); HW: a warp's head-dim columns; MTW: its 16-wide tiles
  constexpr int PARTS = kSplitTrParts, LDS = HD + 8, MT = HD / 16, HDP = HD + 4, WK = 16, HW = HD / PARTS,
                MTW = MT / PARTS;
  static_assert(PARTS == 2, "the scores' exchange below is a pair's");
  static_assert(MTW % 2 == 0, "Q·Kᵀ's k-steps go to two accumulators");
  extern __shared__ __align__(16) unsigned char split_smem[];
  const int rows = T * group;  // <= 8
  const int chunk = blockIdx.x, chunks = gridDim.x, kvh = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const int slice = warp / PARTS, hpart = warp % PARTS, slices = warps / PARTS;
  const int g = lane >> 2, t = lane & 3, mat = lane >> 3, r8 = lane & 7;
  const int stage_keys = slices * WK;
  const int64_t len = past + T, key0 = (int64_t)chunk * chunk_len;
  const int nb = (int)((max((int64_t)0, min(key0 + chunk_len, len) - key0) + stage_keys - 1) / stage_keys);
  // The pairs' score slots [2 parities][warps][4][32 lanes]; then the ring: stage b's K [stage_keys][LDS],
  // then its V
  float* sx = reinterpret_cast<float*>(split_smem);
  bf16* skv = reinterpret_cast<bf16*>(split_smem + sizeof(float) * 2 * 128 * warps);
  pdl_wait();  // q, k, v come from the previous kernels; the partials may still be read by the last merge
  pdl_launch_dependents();
  // Key stage b into ring slot `slot` (b % stages, kept by the loop: no division a stage), copied by the CTA.
  auto load_stage = [&](int b, int slot) {
    split_copy_stage<HD>(skv + slot * 2 * stage_keys * LDS, k, ld_k, v, ld_v, kvh,
                         key0 + (int64_t)b * stage_keys, stage_keys, len);
  };
  for (int b = 0; b < stages - 1; ++b) {
    if (b < nb) load_stage(b, b);
    cp_async_commit();  // empty groups too: the wait below counts groups
  }
  // Qᵀ's B fragments for the warp's MTW k-steps (its part of the head dim): lane (g, t) holds row
  // g's columns 16kk + 2t, +1 and 16kk + 2t + 8, +9 (zero for rows past the step's).
  uint32_t qf[MTW][2];
  {
    const bool in = g < rows;
    const bf16* qr = q + (int64_t)(in ? g / group : 0) * ld_q +
                     (int64_t)(kvh * group + (in ? g % group : 0)) * HD + hpart * HW + 2 * t;
#pragma unroll
    for (int kk = 0; kk < MTW; ++kk) {
      qf[kk][0] = in ? __ldg(reinterpret_cast<const unsigned int*>(qr + 16 * kk)) : 0u;
      qf[kk][1] = in ? __ldg(reinterpret_cast<const unsigned int*>(qr + 16 * kk + 8)) : 0u;
    }
  }
  // This lane's rows a = 2t and b = 2t + 1 see keys up to past + their token; rows past the step's none.
  const int64_t lim_a = 2 * t < rows ? past + 2 * t / group : -1;
  const int64_t lim_b = 2 * t + 1 < rows ? past + (2 * t + 1) / group : -1;
  // Oᵀ: (hd hpart·HW + 16m + g, rows 2t, 2t + 1), (hd hpart·HW + 16m + g + 8, rows 2t, 2t + 1)
  float acc[MTW][4];
#pragma unroll
  for (int m = 0; m < MTW; ++m) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;  // l: this lane's keys only
  // rd: stage b's ring slot; wr: stage b + stages − 1's
  for (int b = 0, rd = 0, wr = stages - 1; b < nb;
       ++b, rd = rd + 1 == stages ? 0 : rd + 1, wr = wr + 1 == stages ? 0 : wr + 1) {
    if (b + stages - 1 < nb) load_stage(b + stages - 1, wr);
    cp_async_commit();
    cp_async_wait_n(stages - 1);  // stage b has landed (this thread's copies)
    __syncthreads();              // ... and every thread's
    const bf16* sk = skv + rd * 2 * stage_keys * LDS + slice * WK * LDS + hpart * HW;
    const bf16* sv = sk + stage_keys * LDS;
    // Sᵀ = K·Qᵀ over the head dim, even and odd k-steps in two accumulators (two chains of MT / 2 MMAs).
    float s0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const bf16* kf = sk + ((mat & 1) * 8 + r8) * LDS + (mat >> 1) * 8;
#pragma unroll
    for (int kk = 0; kk < MTW; kk += 2) {
      uint32_t a[4], c[4];
      ldmatrix_x4(a, kf + kk * 16);
      ldmatrix_x4(c, kf + (kk + 1) * 16);
      mma_bf16_16816(s0, a[0], a[1], a[2], a[3], qf[kk][0], qf[kk][1]);
      mma_bf16_16816(s1, c[0], c[1], c[2], c[3], qf[kk + 1][0], qf[kk + 1][1]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) s0[i] += s1[i];
    {
      // The pair's halves of the dot products through shared memory, added as mine + the other's: fp32
      // addition commutes, so both warps hold the same bits. A slot of this parity is not rewritten before
      // all pass the CTA barrier that ends the stage.
      float* mine = sx + ((b & 1) * warps + warp) * 128 + lane;
      const float* other = sx + ((b & 1) * warps + (warp ^ 1)) * 128 + lane;
#pragma unroll
      for (int i = 0; i < 4; ++i) mine[32 * i] = s0[i];
      named_bar_sync(1 + slice, 64);
#pragma unroll
      for (int i = 0; i < 4; ++i) s0[i] += other[32 * i];
    }
    const int64_t j = key0 + (int64_t)b * stage_keys + slice * WK + g;  // keys j (s[0], s[1]) and j + 8
    const float x0 = j <= lim_a ? s0[0] * scale_log2 : -INFINITY;
    const float x1 = j <= lim_b ? s0[1] * scale_log2 : -INFINITY;
    const float x2 = j + 8 <= lim_a ? s0[2] * scale_log2 : -INFINITY;
    const float x3 = j + 8 <= lim_b ? s0[3] * scale_log2 : -INFINITY;
    float mx_a = fmaxf(x0, x2), mx_b = fmaxf(x1, x3);
#pragma unroll
    for (int o = 4; o <= 16; o <<= 1) {  // a row's 16 keys are over the lanes of its t
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, o));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, o));
    }
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    // A row with no visible key so far keeps max −inf: subtracting 0 instead gives p = 0, not NaN.
    const float base_a = mn_a == -INFINITY ? 0.0f : mn_a, base_b = mn_b == -INFINITY ? 0.0f : mn_b;
    const float c_a = exp2f(m_a - base_a), c_b = exp2f(m_b - base_b);
    const float p0 = exp2f(x0 - base_a), p1 = exp2f(x1 - base_b), p2 = exp2f(x2 - base_a),
                p3 = exp2f(x3 - base_b);
    l_a = l_a * c_a + (p0 + p2);
    l_b = l_b * c_b + (p1 + p3);
    m_a = mn_a;
    m_b = mn_b;
#pragma unroll
    for (int m = 0; m < MTW; ++m) {
      acc[m][0] *= c_a;
      acc[m][1] *= c_b;
      acc[m][2] *= c_a;
      acc[m][3] *= c_b;
    }
    // Pᵀ's fragment (keys g, g + 8 × rows 2t, 2t + 1) split into bf16 hi + lo, each 8 × 8 half transposed
    // into P's B fragment (rows g × keys 2t, 2t + 1 and 2t + 8, 2t + 9).
    uint32_t h0, lo0, h1, lo1;
    split_bf16x2(p0, p1, h0, lo0);
    split_bf16x2(p2, p3, h1, lo1);
    const uint32_t bh0 = movmatrix_trans(h0), bh1 = movmatrix_trans(h1), bl0 = movmatrix_trans(lo0),
                   bl1 = movmatrix_trans(lo1);
    // Oᵀ += Vᵀ·Pᵀ: Vᵀ's A fragments by ldmatrix.trans of V [keys][hd], 16 head dims at a time.
    const bf16* vf = sv + ((mat >> 1) * 8 + r8) * LDS + (mat & 1) * 8;
#pragma unroll
    for (int m = 0; m < MTW; ++m) {
      uint32_t a[4];
      ldmatrix_x4_trans(a, vf + m * 16);
      mma_bf16_16816(acc[m], a[0], a[1], a[2], a[3], bh0, bh1);
      mma_bf16_16816(acc[m], a[0], a[1], a[2], a[3], bl0, bl1);
    }
    __syncthreads();  // ring slot rd is refilled next iteration
  }
  cp_async_wait<0>();
#pragma unroll
  for (int o = 4; o <= 16; o <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, o);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, o);
  }
  // Merge the warps: each puts its rows' (max, sum) in shared memory, takes the CTA's max M of each row,
  // rescales its acc by 2^(m − M) and leaves it there as [row][hd]; then the CTA's threads add the warps' acc
  // in warp order, a float4 of a row each, and write the partial. The ring is free (the loop ended on a
  // barrier; an nb = 0 CTA never filled it).
  float* mlw = reinterpret_cast<float*>(skv);  // [slices][8 rows][2]
  float* accw = mlw + 16 * slices;             // [slices][8 rows][HDP]
  if (g == 0 && hpart == 0) {                  // a slice's warps hold the same (m, l) bits
    mlw[(slice * 8 + 2 * t) * 2] = m_a;
    mlw[(slice * 8 + 2 * t) * 2 + 1] = l_a;
    mlw[(slice * 8 + 2 * t + 1) * 2] = m_b;
    mlw[(slice * 8 + 2 * t + 1) * 2 + 1] = l_b;
  }
  __syncthreads();
  float M_a = -INFINITY, M_b = -INFINITY;
  for (int w = 0; w < slices; ++w) {
    M_a = fmaxf(M_a, mlw[(w * 8 + 2 * t) * 2]);
    M_b = fmaxf(M_b, mlw[(w * 8 + 2 * t + 1) * 2]);
  }
  const float B_a = M_a == -INFINITY ? 0.0f : M_a, B_b = M_b == -INFINITY ? 0.0f : M_b;
  const float f_a = exp2f(m_a - B_a), f_b = exp2f(m_b - B_b);
  float* mine = accw + slice * 8 * HDP + hpart * HW + g;
#pragma unroll
  for (int m = 0; m < MTW; ++m) {
    mine[(2 * t) * HDP + 16 * m] = acc[m][0] * f_a;
    mine[(2 * t + 1) * HDP + 16 * m] = acc[m][1] * f_b;
    mine[(2 * t) * HDP + 16 * m + 8] = acc[m][2] * f_a;
    mine[(2 * t + 1) * HDP + 16 * m + 8] = acc[m][3] * f_b;
  }
  if (warp == 0 && g == 0) {  // the rows' (M, L) as attention_merge_kernel reads them
    float L_a = 0.0f, L_b = 0.0f;
    for (int w = 0; w < slices; ++w) {
      L_a += mlw[(w * 8 + 2 * t) * 2 + 1] * exp2f(mlw[(w * 8 + 2 * t) * 2] - B_a);
      L_b += mlw[(w * 8 + 2 * t + 1) * 2 + 1] * exp2f(mlw[(w * 8 + 2 * t + 1) * 2] - B_b);
    }
    float* ml = part_ml + ((int64_t)kvh * chunks + chunk) * rows * 2;
    if (2 * t < rows) *reinterpret_cast<float2*>(ml + 4 * t) = make_float2(M_a, L_a);
    if (2 * t + 1 < rows) *reinterpret_cast<float2*>(ml + 4 * t + 2) = make_float2(M_b, L_b);
  }
  __syncthreads();
  float* prow = part + ((int64_t)kvh * chunks + chunk) * rows * HD;
  for (int i = threadIdx.x; i < rows * (HD / 4); i += blockDim.x) {
    const int r = i / (HD / 4), c = (i % (HD / 4)) * 4;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int w = 0; w < slices; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(accw + (w * 8 + r) * HDP + c);
      o.x += x.x;
      o.y += x.y;
      o.z += x.z;
      o.w += x.w;
    }
    *reinterpret_cast<float4*>(prow + (int64_t)r * HD + c) = o;
  }
}

// ---- merging the chunks -------------------------------------------------------------------------------
// Where attention_merge_kernel's per-group sums start in its shared memory: after the chunk weights, at a
// float4 boundary.
__host__ __device__ constexpr int merge_sums_at(int chunks) { return (chunks + 3) / 4 * 4; }

// Blocks of the merge: kMergeThreads threads, kMergeCols output columns of a row each, the threads of a
// column walking every kMergeGroups-th chunk, the first kMergeEarly of a thread's chunks read before the
// weights. The groups' sums take kMergeThreads float4s.
constexpr int kMergeCols = 64;
constexpr int kMergeEarly = 3;
constexpr int kMergeGroups = kMergeThreads / (kMergeCols / 4);

// Block (r, kvh, slice): columns [slice·kMergeCols, +kMergeCols) of row r of kv head kvh merged over the
// chunks, o = Σ acc·2^(m − M) / Σ l·2^(m − M), then rounded and gated as the general kernel. A chunk with no
// key for the row has m = −inf and acc = l = 0 (every row sees key 0, so M is finite). Every thread reads
// some chunks' (m, l) at once, and the blocks split each row into hd / 64 column slices: a T = 1 step has
// only group · hkv rows, too few blocks a row to spread over the SMs otherwise.
__global__ void __launch_bounds__(kMergeThreads)
    attention_merge_kernel(const float* __restrict__ part, const float* __restrict__ part_ml,
                           bf16* __restrict__ out, int64_t ld_out, const bf16* __restrict__ gate,
                           int64_t ld_gate, int rows, int group, int chunks, int hd) {
  constexpr int COLS = kMergeCols, EARLY = kMergeEarly, GROUPS = kMergeGroups;
  extern __shared__ __align__(16) float merge_w[];  // [chunks] 2^(m − M), then [GROUPS][COLS] sums
  const int r = blockIdx.x, kvh = blockIdx.y, c0 = blockIdx.z * COLS;
  const int64_t t = r / group, h = (int64_t)kvh * group + r % group, unit0 = (int64_t)kvh * chunks;
  pdl_wait();
  pdl_launch_dependents();
  // Everything this block reads is issued before the weights are known, so the chain is one round trip
  // to L2: the gate of its output column, the chunks' (m, l), and the first EARLY chunks' acc a thread
  // (27B at T 1: 33 chunks, 3 a thread).
  const int64_t d_out = c0 + threadIdx.x;
  const float g = gate && threadIdx.x < COLS ? __bfloat162float(gate[t * ld_gate + h * hd + d_out]) : 0.0f;
  constexpr int cols = COLS / 4;
  const int col = threadIdx.x % cols, grp = threadIdx.x / cols;
  const float4* acc = reinterpret_cast<const float4*>(part + (unit0 * rows + r) * hd + c0) + col;
  const int64_t ca = (int64_t)rows * hd / 4;  // a chunk's stride in float4s
  float4 early[EARLY];
#pragma unroll
  for (int i = 0; i < EARLY; ++i) {
    const int c = grp + i * GROUPS;
    early[i] = c < chunks ? acc[c * ca] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const float2* ml = reinterpret_cast<const float2*>(part_ml) + unit0 * rows + r;  // chunk c at ml[c · rows]
  float mt = -INFINITY;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) mt = fmaxf(mt, ml[(int64_t)c * rows].x);
  mt = block_max(mt);
  float lt = 0.0f;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    const float2 x = ml[(int64_t)c * rows];
    const float w = exp2f(x.x - mt);
    merge_w[c] = w;
    lt += x.y * w;
  }
  lt = block_sum(lt);  // its barriers also publish merge_w
  float* sums = merge_w + merge_sums_at(chunks);
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  auto add = [&](const float4& x, int c) {
    const float w = merge_w[c];
    o.x += x.x * w;
    o.y += x.y * w;
    o.z += x.z * w;
    o.w += x.w * w;
  };
#pragma unroll
  for (int i = 0; i < EARLY; ++i)
    if (grp + i * GROUPS < chunks) add(early[i], grp + i * GROUPS);
#pragma unroll 4
  for (int c = grp + EARLY * GROUPS; c < chunks; c += GROUPS) add(acc[c * ca], c);
  *reinterpret_cast<float4*>(sums + grp * COLS + 4 * col) = o;
  __syncthreads();
  if (threadIdx.x < COLS) {
    float y = 0.0f;
    for (int k = 0; k < GROUPS; ++k) y += sums[k * COLS + threadIdx.x];
    y = bf16_rn(y * (1.0f / lt));
    if (gate) y = sigmoid_gate_f32(y, g);
    out[t * ld_out + h * hd + d_out] = __float2bfloat16(y);
  }
}

// ---- launchers ----------------------------------------------------------------------------------------

// Allows the split kernels the current device's opt-in shared memory a block (a per-function attribute), once
// per device: the launchers run every layer of every decode step, so they make no attribute calls of their
// own.
void split_kernels_allow_smem() {
  constexpr int kDevices = 64;
  static std::once_flag once[kDevices];
  int dev = 0;
  DF_CUDA_CHECK(cudaGetDevice(&dev));
  DF_CHECK(dev >= 0 && dev < kDevices, "device %d: only devices 0..%d are supported", dev, kDevices - 1);
  std::call_once(once[dev], [] {
    const int smem = int(device_caps().smem_optin);
    for (auto kernel : {attention_split_kernel<128, 1>, attention_split_kernel<128, 2>,
                        attention_split_kernel<256, 1>, attention_split_kernel<256, 2>})
      DF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    for (auto kernel : {attention_split_tr_kernel<128>, attention_split_tr_kernel<256>})
      DF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  });
}

}  // namespace

void attention_split_run(const SplitPlan& p, const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k,
                         const bf16* v, int64_t ld_v, bf16* out, int64_t ld_out, const bf16* gate,
                         int64_t ld_gate, int64_t T, int64_t past, int hq, int hkv, int hd, float scale,
                         void* workspace, cudaStream_t stream) {
  split_kernels_allow_smem();
  const int group = hq / hkv, rows = int(T * group);
  float* part = static_cast<float*>(workspace);
  float* part_ml = part + int64_t(hkv) * p.chunks * rows * hd;
  const float scale_log2 = scale * 1.4426950408889634f;
  const dim3 grid((unsigned)p.chunks, (unsigned)hkv, (unsigned)p.groups);
  const dim3 block(p.threads());
  if (p.tr) {
    launch_pdl(hd == 128 ? attention_split_tr_kernel<128> : attention_split_tr_kernel<256>, grid, block, p.smem,
               stream, q, ld_q, k, ld_k, v, ld_v, part, part_ml, past, int(T), group, p.chunk_len, p.stages,
               scale_log2);
  } else {
    auto split = p.halves == 1 ? (hd == 128 ? attention_split_kernel<128, 1> : attention_split_kernel<256, 1>)
                               : (hd == 128 ? attention_split_kernel<128, 2> : attention_split_kernel<256, 2>);
    launch_pdl(split, grid, block, p.smem, stream, q, ld_q, k, ld_k, v, ld_v, part, part_ml, past, int(T),
               group, p.cta_rows, p.chunk_len, p.slices, p.stages, scale_log2);
  }
  const size_t merge_smem = sizeof(float) * size_t(merge_sums_at(p.chunks) + 4 * kMergeThreads);
  launch_pdl(attention_merge_kernel, dim3((unsigned)rows, (unsigned)hkv, (unsigned)(hd / kMergeCols)),
             dim3(kMergeThreads), merge_smem, stream, part, part_ml, out, ld_out, gate, ld_gate, rows, group,
             p.chunks, hd);
}

}  // namespace df
