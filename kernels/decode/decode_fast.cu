// Incremental decoding's fast attention (kernels/decode/decode.cuh; decode.cu has the launchers and the general kernels,
// decode_gdn.cu the fast DeltaNet decode): attention over a cache split over key chunks on tensor cores with a
// merge kernel, both launched with programmatic dependent launch (pdl.cuh).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "kernels/primitives/cuda_check.cuh"
#include "kernels/decode/decode.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/primitives/env_switch.h"
#include "kernels/launchers.cuh"
#include "kernels/primitives/mma.cuh"
#include "kernels/primitives/pdl.cuh"

namespace df {

namespace {

// ---- split-KV attention over a cache on tensor cores -----------------------------------------------------
// Rows of a kv head's work: r = t·group + g is token t of query head kvh·group + g, so all rows of a CTA read
// the same K / V. A CTA takes a group of cta_rows <= kSplitMaxRows of them (split_plan picks the groups), one
// m16 tile per warp (HALVES 1) or per pair of warps (HALVES 2), and `slices` warps (pairs) per tile that
// share the key stages: a stage is slices × WK keys (WK = kSplitWarpKeys, 32 on the pairs path) and warp
// (tile, slice) runs its own online softmax over its WK of them, so a short step (T = 1: one tile) still has
// up to kSplitMaxWarps warps on the tensor cores while the copies of the next stages are in flight. The
// slices of a tile are merged in shared memory at the end, so a CTA writes one partial per row. HALVES 2 is
// the verify step's path (T 16: 4-8 tiles, so HALVES 1 leaves one or two slices and 4-8 warps an SM, each
// running a long serial chain per stage: 235 registers at hd 256, 6 warps, 23 % of the issue slots busy,
// Nsight Compute, session 14): the two warps of a pair each take half of Q·Kᵀ's head dim and add their
// partial scores through shared memory, run the same softmax on the same sums, and each computes P·V for its
// half of the output columns, so a warp's chain per stage and its accumulator are half as long and twice the
// warps fit.
constexpr int kSplitWarpKeys = 16;
constexpr int kSplitMaxStages = 6;
constexpr int kSplitMaxRows = 128;
constexpr int kSplitMaxWarps = 8;
constexpr int kMergeThreads = 256;

// Warps a CTA of the split kernel may have: HALVES 2 sized so its registers fit one CTA an SM (hd 256: 12
// warps of up to 168 registers, ptxas gives 138; hd 128: 16 of up to 128, ptxas 106).
__host__ __device__ constexpr int split_max_warps(int hd, int halves) {
  return halves == 1 ? kSplitMaxWarps : hd == 256 ? 12 : 16;
}

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
// HD / 8 divides 32), so no copy divides an index at run time: the index arithmetic of a flat loop over
// (row, piece), a division by the stage's keys per copy, was 70 % of the instructions executed at T 1 (27B,
// Nsight Compute, session 17), and each warp's chain of instructions is what the step waits for. STEP: where
// the whole stage lies in the cache (every stage but a chunk's last, near the cache's end), the sources step
// by `step` rows with no clamp and no 64-bit multiply a row: 11 PTX instructions a row's two copies instead
// of 24 (sm_90a, hd 256), at 27B T 1 8 rows a thread a stage (DFLASH_SPLIT_COPY=step, the transposed kernel
// only; not yet timed).
template <int HD, bool STEP = false>
__device__ __forceinline__ void split_copy_stage(bf16* slot, const bf16* __restrict__ k, int64_t ld_k,
                                                 const bf16* __restrict__ v, int64_t ld_v, int kvh,
                                                 int64_t kb, int keys, int64_t len) {
  constexpr int LDS = HD + 8, CH = HD / 8;
  static_assert(32 % CH == 0, "a thread's copies keep one column piece: CH must divide a warp");
  const int col = (threadIdx.x % CH) * 8, step = blockDim.x / CH;
  const bf16* kcol = k + (int64_t)kvh * HD + col;
  const bf16* vcol = v + (int64_t)kvh * HD + col;
  bf16* dst = slot + col;
  if constexpr (STEP) {
    if (kb + keys <= len) {
      const int r0 = threadIdx.x / CH;
      const int64_t k_step = step * ld_k, v_step = step * ld_v;
      const bf16* ks = kcol + (kb + r0) * ld_k;
      const bf16* vs = vcol + (kb + r0) * ld_v;
      bf16* d = dst + r0 * LDS;
      for (int r = r0; r < keys; r += step, ks += k_step, vs += v_step, d += step * LDS) {
        cp_async_16(d, ks, 16);
        cp_async_16(d + keys * LDS, vs, 16);
      }
      return;
    }
  }
  for (int r = threadIdx.x / CH; r < keys; r += step) {
    const int64_t j = min(kb + r, len - 1);
    cp_async_16(dst + r * LDS, kcol + j * ld_k, 16);
    cp_async_16(dst + (keys + r) * LDS, vcol + j * ld_v, 16);
  }
}

// Block (chunk, kvh, z): keys [chunk·chunk_len, +chunk_len) of the cache against rows [z·cta_rows, +cta_rows)
// of kv head kvh, stopping at the last key those rows see (a chunk wholly past it writes m = −inf, l = 0).
// blockDim is 32 · wtiles · HALVES · slices; `stages` ring buffers of slices · WK keys (chunk_len a multiple
// of that), WK keys a warp a stage (kSplitWarpKeys, or 32 on the pairs path, whose per-stage costs — the
// scores' exchange, the barriers, the rescale of acc — then come once per 32 keys). Scores and the softmax in
// fp32 (log2 domain: scale_log2 = scale·log2 e); P enters P·V split into bf16 hi + lo, so its weights keep 16
// mantissa bits (a plain bf16 P would cost 2^-9 relative per key, far above the decode's fp32 contract).
// Writes the chunk's unnormalised acc [rows][HD] to part and (max, sum) per row to part_ml.
template <int HD, int HALVES, int WK>
__global__ void __launch_bounds__(32 * split_max_warps(HD, HALVES))
    attention_split_kernel(const bf16* __restrict__ q, int64_t ld_q, const bf16* __restrict__ k, int64_t ld_k,
                           const bf16* __restrict__ v, int64_t ld_v, float* __restrict__ part,
                           float* __restrict__ part_ml, int64_t past, int T, int group, int cta_rows,
                           int chunk_len, int slices, int stages, float scale_log2) {
  // HW: the head-dim columns a warp multiplies and writes; CH: 16-byte pieces of a row
  // KN: 8-key n-tiles of a warp's scores; SLOT: floats of a pair's score slot per warp
  constexpr int LDS = HD + 8, HW = HD / HALVES, NT = HW / 8, CH = HD / 8, KN = WK / 8, SLOT = 128 * KN;
  static_assert(WK == 16 || WK == 32, "a warp's keys a stage: one or two 16-key k-steps of P·V");
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
// attention_split_kernel spends most of its tensor work, and half its registers (a 16 × hd fp32 acc), on
// padding rows, and its one warp a scheduler waits on each MMA in turn (27B T 1: 248 registers, 4.2 cycles an
// issued instruction, the split kernel as slow with K and V in L2 as from DRAM; Nsight Compute, session 23).
// This kernel computes the transposed products, keys and head dims as the MMAs' M side and the rows as their
// 8-wide N side: Sᵀ = K·Qᵀ, then Oᵀ += Vᵀ·Pᵀ, so a warp's acc is hd × 8 (half the registers), a 16-key stage
// takes half the MMAs, and Q stays in registers as B fragments. Block (chunk, kvh): every row of kv head kvh
// against keys [chunk·chunk_len, +chunk_len); key slice s (a warp, or PARTS warps: below) takes
// keys [16s, +16) of each stage of 16 · slices keys (a ring of `stages`, as attention_split_kernel) and runs
// its own online softmax over them. The C fragment
// of Sᵀ (lane (g, t): keys g and g + 8 of rows 2t, 2t + 1) becomes P's B fragment (rows g, keys 2t ..) by
// movmatrix, split into bf16 hi + lo as in attention_split_kernel. The warps' acc are merged through shared
// memory at the end, each CTA writing one partial per row (the layout attention_merge_kernel reads).
// PARTS warps a key slice, splitting the head dim: warp PARTS·slice + hpart takes columns [hpart·hd/PARTS,
// +hd/PARTS) of the slice's 16 keys. It multiplies only those (a PARTS-th of Q·Kᵀ's k-steps, of P·V's
// head-dim tiles and of acc), the slice's warps adding their partial scores through shared memory
// (double-buffered by stage parity, a 32·PARTS-thread named barrier a stage) so all run the same softmax on
// the same sums: PARTS times the warps an SM for the same shared memory. PARTS 2 is the default (split_plan;
// 27B T 1 11.20 us against 11.49 with one warp a slice, 8B 11.31 against 11.88; bench_kernels decode on an
// H200, session 24); DFLASH_SPLIT_TRWARPS=1 or 4 picks one warp or four a slice (four: up to 16 warps at hd
// 256, 32 at hd 128, split_tr_max_warps). The CTA's threads copy each stage together and meet at a barrier
// before and after it, as attention_split_kernel does. (Warps that copied and waited for their own stage rows
// only, with no CTA barrier until the merge, measured no faster: 27B T 1 12.51 against 12.46 us over four
// passes on an H100, session 24; removed.)
__host__ __device__ constexpr int split_tr_max_warps(int hd, int parts) {
  return parts == 4 ? (hd == 256 ? 16 : 32) : hd == 256 ? 8 : 16;
}

// STEP: stage copies stepped by rows (split_copy_stage). The four-warp builds ask for one block an SM (what
// their shared memory allows anyway): with no minimum, ptxas held the 512-thread hd-256 build to 64 registers
// and spilled. 0 leaves the other builds as they were.
template <int HD, int PARTS, bool STEP>
__global__ void __launch_bounds__(32 * split_tr_max_warps(HD, PARTS), PARTS == 4 ? 1 : 0)
    attention_split_tr_kernel(const bf16* __restrict__ q, int64_t ld_q, const bf16* __restrict__ k,
                              int64_t ld_k, const bf16* __restrict__ v, int64_t ld_v,
                              float* __restrict__ part, float* __restrict__ part_ml, int64_t past, int T,
                              int group, int chunk_len, int stages, float scale_log2) {
  // MT: 16-wide head-dim tiles; HDP: a merge row's floats (HD + 4: the 8 rows × 4 column groups a warp
  // instruction stores fall in 32 different banks); HW: a warp's head-dim columns; MTW: its 16-wide tiles
  constexpr int LDS = HD + 8, MT = HD / 16, HDP = HD + 4, WK = 16, HW = HD / PARTS, MTW = MT / PARTS;
  static_assert(PARTS == 1 || PARTS == 2 || PARTS == 4, "one, two or four warps a key slice");
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
  // PARTS > 1: the slices' score slots [2 parities][warps][4][32 lanes]; then the ring: stage b's K
  // [stage_keys][LDS], then its V
  float* sx = reinterpret_cast<float*>(split_smem);
  bf16* skv = reinterpret_cast<bf16*>(split_smem + (PARTS > 1 ? sizeof(float) * 2 * 128 * warps : 0));
  pdl_wait();  // q, k, v come from the previous kernels; the partials may still be read by the last merge
  pdl_launch_dependents();
  // Key stage b into ring slot `slot` (b % stages, kept by the loop: no division a stage), copied by the CTA.
  auto load_stage = [&](int b, int slot) {
    split_copy_stage<HD, STEP>(skv + slot * 2 * stage_keys * LDS, k, ld_k, v, ld_v, kvh,
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
    if constexpr (PARTS > 1) {
      // The slice's parts of the dot products through shared memory, added in an order every warp of the
      // slice shares, so all hold the same bits: mine + the other's at PARTS 2 (fp32 addition commutes), (p0
      // + p1) + (p2 + p3) at PARTS 4. A slot of this parity is not rewritten before all pass the CTA barrier
      // that ends the stage.
      if constexpr (PARTS == 2) {
        float* mine = sx + ((b & 1) * warps + warp) * 128 + lane;
        const float* other = sx + ((b & 1) * warps + (warp ^ 1)) * 128 + lane;
#pragma unroll
        for (int i = 0; i < 4; ++i) mine[32 * i] = s0[i];
        named_bar_sync(1 + slice, 64);
#pragma unroll
        for (int i = 0; i < 4; ++i) s0[i] += other[32 * i];
      } else {
        float* slots = sx + ((b & 1) * warps + slice * PARTS) * 128 + lane;
#pragma unroll
        for (int i = 0; i < 4; ++i) slots[hpart * 128 + 32 * i] = s0[i];
        named_bar_sync(1 + slice, 32 * PARTS);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          s0[i] = (slots[32 * i] + slots[128 + 32 * i]) + (slots[256 + 32 * i] + slots[384 + 32 * i]);
      }
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

// The transposed kernel at head dim hd (128 or 256) with `parts` warps a key slice (1, 2 or 4), its stage
// copies stepped or not.
using SplitTrKernel = decltype(&attention_split_tr_kernel<128, 2, false>);
template <int HD, bool STEP>
SplitTrKernel split_tr_kernel(int parts) {
  return parts == 4   ? attention_split_tr_kernel<HD, 4, STEP>
         : parts == 2 ? attention_split_tr_kernel<HD, 2, STEP>
                      : attention_split_tr_kernel<HD, 1, STEP>;
}
SplitTrKernel split_tr_kernel(int hd, int parts, bool step) {
  return hd == 128 ? (step ? split_tr_kernel<128, true>(parts) : split_tr_kernel<128, false>(parts))
                   : (step ? split_tr_kernel<256, true>(parts) : split_tr_kernel<256, false>(parts));
}

// ---- merging the chunks -------------------------------------------------------------------------------
// Where attention_merge_kernel's per-group sums start in its shared memory: after the chunk weights, at a
// float4 boundary.
__host__ __device__ constexpr int merge_sums_at(int chunks) { return (chunks + 3) / 4 * 4; }

// Blocks of the merge: kMergeThreads threads, COLS output columns of a row each, the threads of a column
// walking every GROUPS-th chunk (GROUPS = kMergeThreads / (COLS / 4) of them), the first EARLY of a
// thread's chunks read before the weights. Whatever COLS, the groups' sums take kMergeThreads float4s.
template <int COLS>
constexpr int merge_groups() {
  return kMergeThreads / (COLS / 4);
}

// Block (r, kvh, slice): columns [slice·COLS, +COLS) of row r of kv head kvh merged over the chunks,
// o = Σ acc·2^(m − M) / Σ l·2^(m − M), then rounded and gated as the general kernel. A chunk with no key for
// the row has m = −inf and acc = l = 0 (every row sees key 0, so M is finite). Every thread reads some
// chunks' (m, l) at once, and by default (COLS 64, EARLY 3) the blocks split each row into hd / 64 column
// slices: a T = 1 step has only group · hkv rows (a kernel with one block a row and one warp walking the
// chunks' (m, l) took 18.5 us where this takes 16.8 at the 27B shape, session 14). DFLASH_SPLIT_MERGE=wide:
// COLS 128, EARLY 5 (40 chunks), half the blocks, each thread reading up to 5 chunks in its one round trip:
// the verify step's 1,536 blocks at 27B T 16 (96 rows × 4 kv heads × 4 slices) are two waves of 6 blocks an
// SM (38 registers a thread, ptxas), and its merge took 7.8 us (Nsight Compute, session 23); its 768 wide
// blocks (40 registers) are one wave (not yet timed).
template <int COLS, int EARLY>
__global__ void __launch_bounds__(kMergeThreads)
    attention_merge_kernel(const float* __restrict__ part, const float* __restrict__ part_ml,
                           bf16* __restrict__ out, int64_t ld_out, const bf16* __restrict__ gate,
                           int64_t ld_gate, int rows, int group, int chunks, int hd) {
  constexpr int GROUPS = merge_groups<COLS>();
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

// The current device's SM count and opt-in shared memory per block, read once per device, when the split
// kernels are also allowed that much dynamic shared memory (a per-function attribute): the launchers run every
// layer of every decode step, so they make no attribute calls of their own.
struct DeviceLimits {
  int sms = 0, smem = 0;
};
constexpr int kMaxDevices = 64;

const DeviceLimits& device_limits() {
  static DeviceLimits limits[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  int dev = 0;
  DF_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices)
    cuda_throw("device_limits", "device ordinal past the decode kernels' table of 64", __FILE__, __LINE__);
  std::call_once(once[dev], [dev] {
    DeviceLimits& l = limits[dev];
    l.sms = device_sm_count();
    DF_CUDA_CHECK(cudaDeviceGetAttribute(&l.smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    for (auto kernel : {attention_split_kernel<128, 1, 16>, attention_split_kernel<128, 2, 16>,
                        attention_split_kernel<128, 2, 32>, attention_split_kernel<256, 1, 16>,
                        attention_split_kernel<256, 2, 16>, attention_split_kernel<256, 2, 32>})
      DF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, l.smem));
    for (int hd : {128, 256})
      for (int parts : {1, 2, 4})
        for (bool step : {false, true})
          DF_CUDA_CHECK(cudaFuncSetAttribute(split_tr_kernel(hd, parts, step),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, l.smem));
  });
  return limits[dev];
}
// Chunks per kv head to aim for: at most one CTA per SM over the whole grid (a CTA's warps, registers and stage
// ring fill an SM, so rounding up would leave a second wave: 8 kv heads took 17 chunks each, 136 CTAs on 132
// SMs), the row groups of a kv head sharing that budget (down to one chunk each).
int64_t split_chunks_per_head(int64_t groups, int hkv, int sms) {
  return std::max<int64_t>(1, sms / (hkv * groups));
}

// DFLASH_SPLIT_ROWS=n (a multiple of 16 up to 128): n query rows a CTA instead of split_plan's choice, the A/B
// switch of bench_kernels decode (128: one row group per 128 rows, the plan before the partials were weighed).
// Read per call so one process can time both.
int split_rows_forced() {
  const char* e = std::getenv("DFLASH_SPLIT_ROWS");
  const int n = e ? std::atoi(e) : 0;
  return n >= 16 && n <= kSplitMaxRows && n % 16 == 0 ? n : 0;
}

// Where the verify step's pairs of warps (HALVES 2) run: by default at hd 256 only, where they measured
// faster (27B T 16: 32.1 against 35.9 us one warp a tile; at hd 128 the 8B step took 27.5 against 24.9 us,
// bench_kernels decode, session 15). DFLASH_SPLIT_T16=old: nowhere (the one-warp-a-tile kernel, the plan
// before the pairs); =pairs: wherever they fit, hd 128 too (what the tests run). Read per call, as
// DFLASH_SPLIT_ROWS.
bool split_halves_at(int hd) {
  return env_is("DFLASH_SPLIT_T16", "old") ? false : env_is("DFLASH_SPLIT_T16", "pairs") ? true : hd == 256;
}

// Where a step takes the transposed kernel: T·group <= 8 rows a kv head unless DFLASH_SPLIT_TR=0 (then
// attention_split_kernel's m16 tile, the path before it; read per call: the A/B switch of bench_kernels
// decode).
bool split_tr_at(int64_t rows) {
  return rows <= 8 && !env_is("DFLASH_SPLIT_TR", "0");
}

// How one call splits the work. Row groups of cta_rows: one per kSplitMaxRows rows. More groups would shrink
// the chunks' fp32 partials (27B at T 16: 33 chunks × 96 rows come to 0.77 of 4112 keys' K and V), the groups
// of a chunk reading its keys from L2, but two groups of 48 rows measured slower on the H200 (39.1 µs
// against 35.2 µs, bench_kernels decode, session 13), so they stay an A/B setting (DFLASH_SPLIT_ROWS). Then
// per group: wtiles m16 row tiles, each taken by one warp or, on the verify step's path (3 or more tiles and
// two warps a tile within split_max_warps: hd 256 up to 6 tiles, hd 128 up to 8, where split_halves_at
// allows), a pair of warps (halves 2), × `slices` key slices of them, `chunks` per kv head of chunk_len keys
// (whole stages of slices · wk keys; the last chunk may be shorter), a ring of `stages` stages,
// and the CTA's shared memory (Q tiles, then the ring or the slices' merge area, whichever is larger; a pair
// path's score slots come after Q). Slices: of the counts up to split_max_warps / (wtiles · halves) whose Q
// and two stages fit, the fewest stages a chunk, then the fewest keys: hd 128 at T 1 (8 kv heads) takes 6
// slices, 3 stages of 96 keys, 120 CTAs (16.2 against 16.6 us with 8 slices, 3 stages of 128 keys, 88 CTAs;
// bench_kernels decode, session 16); hd 256 at T 1, 4 slices in two stages of 64 keys, as before (one stage
// of 8 slices, the whole 128-key chunk, measured 20.0 against 17.1 us). Steps of T·group <= 8 rows take the
// transposed kernel (split_tr_at), a pair of warps a key slice, up to split_tr_max_warps warps, by the same
// rule (a pair's score slots counted with Q): hd 256 at T 1, 4 pairs in two stages of 64 keys, 132 CTAs;
// hd 128 at T 1, 6 pairs in three stages of 96 keys, 120 CTAs. With one warp a slice (DFLASH_SPLIT_TRWARPS=1)
// the rule took 4 warps at hd 256 (27B: 13.99 us against 14.27 on attention_split_kernel; one stage of 8
// warps 14.94) and 9 warps in two stages of 144 keys at hd 128 (8B: 13.25 against 14.72; one stage of 16
// warps 16.30, 6 warps 13.53; bench_kernels decode on an H100, session 24). With four warps a slice
// (DFLASH_SPLIT_TRWARPS=4: up to 16 warps at hd 256, 32 at hd 128) it takes the pairs' stages: 4 slices in
// two stages of 64 keys at hd 256, 6 in three of 96 at hd 128 (not yet timed). `budget`: the device's opt-in
// shared memory a block.
SplitPlan split_plan(int64_t T, int64_t past, int group, int hkv, int hd, int sms, size_t budget) {
  const int64_t rows = T * group;
  SplitPlan p;
  const int64_t tiles = (rows + 15) / 16;
  const int64_t groups = std::min({tiles, int64_t(65535), (rows + kSplitMaxRows - 1) / kSplitMaxRows});
  const int forced = split_rows_forced();  // taken where its groups fit the grid
  p.cta_rows = forced && (rows + forced - 1) / forced <= 65535 ? forced : int(16 * ((tiles + groups - 1) / groups));
  p.groups = int((rows + p.cta_rows - 1) / p.cta_rows);
  p.wtiles = int((std::min<int64_t>(rows, p.cta_rows) + 15) / 16);
  p.halves = split_halves_at(hd) && p.wtiles >= 3 && 2 * p.wtiles <= split_max_warps(hd, 2) ? 2 : 1;
  // Keys a warp a stage: 32 on the pairs path unless DFLASH_SPLIT_WK=16 (read per call: the A/B switch of
  // bench_kernels decode).
  p.wk = p.halves == 2 && !env_is("DFLASH_SPLIT_WK", "16") ? 32 : kSplitWarpKeys;
  p.tr = split_tr_at(rows);  // then wtiles 1, wk 16: one warp (or pair) a key slice, Q in registers
  // The transposed kernel's warps a key slice (halves: its PARTS): a pair unless DFLASH_SPLIT_TRWARPS=1 or 4
  // (read per call: the A/B switch of bench_kernels decode)
  if (p.tr) p.halves = env_is("DFLASH_SPLIT_TRWARPS", "1") ? 1 : env_is("DFLASH_SPLIT_TRWARPS", "4") ? 4 : 2;
  const int wslice = p.wtiles * p.halves;  // warps a key slice
  const int max_warps = p.tr ? split_tr_max_warps(hd, p.halves) : split_max_warps(hd, p.halves);
  p.slices = std::max(1, max_warps / wslice);
  const size_t row_bytes = sizeof(bf16) * size_t(hd + 8);
  auto q_bytes = [&](int slices) {  // Q tiles, then a pair path's score slots (wk / 2 floats a lane)
    if (p.tr) return sizeof(float) * 2 * 128 * size_t(wslice * slices) * (p.halves > 1);  // pairs' slots
    return size_t(p.wtiles) * 16 * row_bytes +
           (p.halves > 1 ? sizeof(float) * 16 * size_t(p.wk) * size_t(wslice * slices) : 0);
  };
  auto stage_bytes = [&](int slices) { return size_t(2 * slices * p.wk) * row_bytes; };
  // Stages of keys over the cache and the new tokens, chunks per kv head, stages a chunk.
  auto chunking = [&](int slices, int64_t& blocks, int64_t& per_head, int64_t& per_chunk) {
    const int stage_keys = slices * p.wk;
    blocks = (past + T + stage_keys - 1) / stage_keys;
    per_head = std::min(split_chunks_per_head(p.groups, hkv, sms), blocks);
    per_chunk = (blocks + per_head - 1) / per_head;
  };
  // Of the slice counts whose Q and two stages fit, the one with the fewest stages a chunk (each warp's
  // serial work), then the fewest keys a chunk (each CTA's bytes; more chunks, up to one CTA an SM); one
  // slice if none fits. DFLASH_SPLIT_PLAN=halve: the rule before, slices halved until two stages fit (the A/B
  // switch of bench_kernels decode; read per call).
  const bool halve = env_is("DFLASH_SPLIT_PLAN", "halve");
  int64_t blocks = 0, per_head = 0, per_chunk = 0;
  if (halve) {
    for (;; p.slices /= 2) {
      chunking(p.slices, blocks, per_head, per_chunk);
      if (p.slices == 1 || q_bytes(p.slices) + 2 * stage_bytes(p.slices) <= budget) break;
    }
  } else {
    int best = 1;
    int64_t best_stages = 0, best_keys = 0;
    for (int s = p.slices; s >= 1; --s) {
      chunking(s, blocks, per_head, per_chunk);
      const bool fits = q_bytes(s) + 2 * stage_bytes(s) <= budget;
      const int64_t keys = per_chunk * s * p.wk;
      if (fits &&
          (best_stages == 0 || per_chunk < best_stages || (per_chunk == best_stages && keys < best_keys)))
        best = s, best_stages = per_chunk, best_keys = keys;
    }
    p.slices = best;
    // DFLASH_SPLIT_SLICES=n: n key slices where they fit the warps and Q and one stage fit the shared memory
    // (the A/B switch of bench_kernels decode; read per call).
    const char* e = std::getenv("DFLASH_SPLIT_SLICES");
    const int forced_slices = e ? std::atoi(e) : 0;
    if (forced_slices >= 1 && forced_slices * wslice <= max_warps &&
        q_bytes(forced_slices) + stage_bytes(forced_slices) <= budget)
      p.slices = forced_slices;
    chunking(p.slices, blocks, per_head, per_chunk);
  }
  const int stage_keys = p.slices * p.wk;
  p.chunks = int((blocks + per_chunk - 1) / per_chunk);
  p.chunk_len = int(per_chunk * stage_keys);
  const int64_t fit = int64_t((budget - q_bytes(p.slices)) / stage_bytes(p.slices));
  p.stages = int(std::min<int64_t>({kSplitMaxStages, fit, per_chunk}));
  const size_t merge =
      p.tr ? sizeof(float) * size_t(p.slices) * (16 + 8 * size_t(hd + 4))  // the slices' (m, l), then acc
      : p.slices > 1 ? sizeof(float) * size_t(wslice * p.slices) * (32 + 16 * size_t(hd / p.halves + 8))
                     : size_t(0);
  p.smem = q_bytes(p.slices) + std::max(size_t(p.stages) * stage_bytes(p.slices), merge);
  p.fits = p.stages >= 1 && p.smem <= budget;
  return p;
}

}  // namespace

bool attention_split_shape(int64_t T, int hq, int hkv, int hd) {
  return (hd == 128 || hd == 256) && hkv <= 65535 && T * (hq / hkv) <= int64_t(kSplitMaxRows) * 65535;
}

SplitPlan attention_split_plan(int64_t T, int64_t past, int hq, int hkv, int hd, int sms, size_t smem) {
  return split_plan(T, past, hq / hkv, hkv, hd, sms, smem);
}

int attention_split_max_threads(const SplitPlan& p, int hd) {
  return 32 * (p.tr ? split_tr_max_warps(hd, p.halves) : split_max_warps(hd, p.halves));
}

size_t attention_split_workspace_bytes_for(int64_t T, int hq, int hkv, int hd, int sms) {
  const int64_t rows = T * (hq / hkv);
  // split_plan's fewest row groups give the most chunks
  const int64_t groups = (rows + kSplitMaxRows - 1) / kSplitMaxRows;
  return sizeof(float) * size_t(hkv) * size_t(split_chunks_per_head(groups, hkv, sms)) * size_t(rows) *
         size_t(hd + 2);
}

SplitPlan attention_split_plan_here(int64_t T, int64_t past, int hq, int hkv, int hd) {
  const DeviceLimits& dev = device_limits();
  return attention_split_plan(T, past, hq, hkv, hd, dev.sms, size_t(dev.smem));
}

size_t attention_split_workspace_bytes(int64_t T, int hq, int hkv, int hd) {
  return attention_split_workspace_bytes_for(T, hq, hkv, hd, device_limits().sms);
}

bool attention_split_run(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                         int64_t ld_v, bf16* out, int64_t ld_out, const bf16* gate, int64_t ld_gate,
                         int64_t T, int64_t past, int hq, int hkv, int hd, float scale, void* workspace,
                         cudaStream_t stream) {
  const int group = hq / hkv, rows = int(T * group);
  const SplitPlan p = attention_split_plan_here(T, past, hq, hkv, hd);
  if (!p.fits) return false;
  float* part = static_cast<float*>(workspace);
  float* part_ml = part + int64_t(hkv) * p.chunks * rows * hd;
  const float scale_log2 = scale * 1.4426950408889634f;
  const dim3 grid((unsigned)p.chunks, (unsigned)hkv, (unsigned)p.groups);
  const dim3 block(p.threads());
  if (p.tr) {
    // DFLASH_SPLIT_COPY=step: stage copies whose sources step by rows where the stage is in the cache (read
    // per call: the A/B switch of bench_kernels decode)
    auto tr = split_tr_kernel(hd, p.halves, env_is("DFLASH_SPLIT_COPY", "step"));
    launch_pdl(tr, grid, block, p.smem, stream, q, ld_q, k, ld_k, v, ld_v, part, part_ml, past, int(T), group,
               p.chunk_len, p.stages, scale_log2);
  } else {
    auto split =
        p.halves == 1 ? (hd == 128 ? attention_split_kernel<128, 1, 16> : attention_split_kernel<256, 1, 16>)
        : p.wk == 32  ? (hd == 128 ? attention_split_kernel<128, 2, 32> : attention_split_kernel<256, 2, 32>)
                      : (hd == 128 ? attention_split_kernel<128, 2, 16> : attention_split_kernel<256, 2, 16>);
    launch_pdl(split, grid, block, p.smem, stream, q, ld_q, k, ld_k, v, ld_v, part, part_ml, past, int(T),
               group, p.cta_rows, p.chunk_len, p.slices, p.stages, scale_log2);
  }
  // DFLASH_SPLIT_MERGE=wide: merge blocks of 128 columns (read per call: the A/B switch of bench_kernels
  // decode)
  const bool wide = env_is("DFLASH_SPLIT_MERGE", "wide");
  const int merge_cols = wide ? 128 : 64;
  const size_t merge_smem = sizeof(float) * size_t(merge_sums_at(p.chunks) + 4 * kMergeThreads);
  launch_pdl(wide ? attention_merge_kernel<128, 5> : attention_merge_kernel<64, 3>,
             dim3((unsigned)rows, (unsigned)hkv, (unsigned)(hd / merge_cols)), dim3(kMergeThreads),
             merge_smem, stream, part, part_ml, out, ld_out, gate, ld_gate, rows, group, p.chunks, hd);
  return true;
}

}  // namespace df
