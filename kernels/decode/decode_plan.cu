// Incremental decoding's kernel choices and the split-KV attention's plan (decode_plan.h): host code only, so
// it runs the same for the device present, for another device's limits, and in
// tests/unit/test_decode_plan.cpp without a GPU.
#include <algorithm>

#include "kernels/decode/decode_plan.h"

namespace df {

namespace {

constexpr size_t kBf16Bytes = 2;

// Chunks per kv head to aim for: at most one CTA per SM over the whole grid (a CTA's warps, registers and
// stage ring fill an SM, so rounding up would leave a second wave: 8 kv heads of 17 chunks are 136 CTAs on
// 132 SMs), the row groups of a kv head sharing that budget (down to one chunk each).
int64_t split_chunks_per_head(int64_t groups, int hkv, int sms) {
  return std::max<int64_t>(1, sms / (hkv * groups));
}

}  // namespace

bool attention_split_shape(int64_t T, int hq, int hkv, int hd) {
  return (hd == 128 || hd == 256) && hkv <= 65535 && T * (hq / hkv) <= int64_t(kSplitMaxRows) * 65535;
}

// How one call splits the work. Row groups of cta_rows: one per kSplitMaxRows rows (more groups would shrink
// the chunks' fp32 partials, each group of a chunk reading its keys again from L2, but measured slower). Then
// per group: wtiles m16 row tiles, each taken by one warp or, on the verify step's path at hd 256 (3 to 6
// tiles), a pair of warps (halves 2; at hd 128 one warp a tile measured faster), × `slices` key slices of
// them, `chunks` per kv head of chunk_len keys (whole stages of slices · wk keys; the last chunk may be
// shorter), a ring of `stages` stages, and the CTA's shared memory (Q tiles, then the ring or the slices'
// merge area, whichever is larger; a pair path's score slots come after Q). Steps of T·group <=
// kSplitTrMaxRows rows a kv head take the transposed kernel instead: one row tile, a pair of warps a key
// slice, 16 keys a slice a stage, Q in registers (only the pairs' score slots before the ring). Slices: of
// the counts up to the kernel's warps / (wtiles · halves) whose Q and two stages fit, the fewest stages a
// chunk (each warp's serial work), then the fewest keys a chunk (each CTA's bytes; more chunks, up to one CTA
// an SM); one slice if none fits. On a 132-SM Hopper at T 1 after 4096 cached tokens: hd 256 (24 / 4 heads) 4
// pairs in two stages of 64 keys; hd 128 (32 / 8 heads) 6 pairs in three stages of 96 keys (test_decode_plan
// checks these).
SplitPlan attention_split_plan(int64_t T, int64_t past, int hq, int hkv, int hd, int sms, size_t smem) {
  const int group = hq / hkv;
  const int64_t rows = T * group;
  SplitPlan p;
  const int64_t tiles = (rows + 15) / 16;
  const int64_t groups = std::min({tiles, int64_t(65535), (rows + kSplitMaxRows - 1) / kSplitMaxRows});
  p.cta_rows = int(16 * ((tiles + groups - 1) / groups));
  p.groups = int((rows + p.cta_rows - 1) / p.cta_rows);
  p.wtiles = int((std::min<int64_t>(rows, p.cta_rows) + 15) / 16);
  p.tr = rows <= kSplitTrMaxRows;
  if (p.tr) {
    p.halves = kSplitTrParts;
    p.wk = 16;
  } else {
    p.halves = hd == 256 && p.wtiles >= 3 && 2 * p.wtiles <= split_max_warps(hd, 2) ? 2 : 1;
    p.wk = split_warp_keys(p.halves);
  }
  const int wslice = p.wtiles * p.halves;  // warps a key slice
  const int max_warps = p.tr ? split_tr_max_warps(hd) : split_max_warps(hd, p.halves);
  const size_t row_bytes = kBf16Bytes * size_t(hd + 8);
  auto q_bytes = [&](int slices) {  // Q tiles, then a pair path's score slots (wk / 2 floats a lane)
    if (p.tr) return sizeof(float) * 2 * 128 * size_t(wslice * slices);  // the pairs' slots, both parities
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
  int64_t blocks = 0, per_head = 0, per_chunk = 0;
  int best = 1;
  int64_t best_stages = 0, best_keys = 0;
  for (int s = std::max(1, max_warps / wslice); s >= 1; --s) {
    chunking(s, blocks, per_head, per_chunk);
    const bool fits = q_bytes(s) + 2 * stage_bytes(s) <= smem;
    const int64_t keys = per_chunk * s * p.wk;
    if (fits &&
        (best_stages == 0 || per_chunk < best_stages || (per_chunk == best_stages && keys < best_keys)))
      best = s, best_stages = per_chunk, best_keys = keys;
  }
  p.slices = best;
  chunking(p.slices, blocks, per_head, per_chunk);
  const int stage_keys = p.slices * p.wk;
  p.chunks = int((blocks + per_chunk - 1) / per_chunk);
  p.chunk_len = int(per_chunk * stage_keys);
  const int64_t fit =
      q_bytes(p.slices) <= smem ? int64_t((smem - q_bytes(p.slices)) / stage_bytes(p.slices)) : 0;
  p.stages = int(std::min<int64_t>({kSplitMaxStages, fit, per_chunk}));
  const size_t merge =
      p.tr ? sizeof(float) * size_t(p.slices) * (16 + 8 * size_t(hd + 4))  // the slices' (m, l), then acc
      : p.slices > 1 ? sizeof(float) * size_t(wslice * p.slices) * (32 + 16 * size_t(hd / p.halves + 8))
                     : size_t(0);
  p.smem = q_bytes(p.slices) + std::max(size_t(p.stages) * stage_bytes(p.slices), merge);
  p.fits = p.stages >= 1 && p.smem <= smem;
  return p;
}

int attention_split_max_threads(const SplitPlan& p, int hd) {
  return 32 * (p.tr ? split_tr_max_warps(hd) : split_max_warps(hd, p.halves));
}

size_t attention_split_workspace_bytes_for(int64_t T, int hq, int hkv, int hd, int sms) {
  const int64_t rows = T * (hq / hkv);
  // the plan's fewest row groups give the most chunks
  const int64_t groups = (rows + kSplitMaxRows - 1) / kSplitMaxRows;
  return sizeof(float) * size_t(hkv) * size_t(split_chunks_per_head(groups, hkv, sms)) * size_t(rows) *
         size_t(hd + 2);
}

DecodeAttnChoice decode_attention_choose(const DeviceCaps& caps, const KernelVariants& v, int64_t T,
                                         int64_t past, int hq, int hkv, int hd, bool aligned) {
  DecodeAttnChoice c;
  if (v.decode_general || !aligned || !attention_split_shape(T, hq, hkv, hd)) return c;
  c.plan = attention_split_plan(T, past, hq, hkv, hd, caps.sms, caps.smem_optin);
  if (c.plan.fits) c.kernel = DecodeAttnKernel::split;
  return c;
}

GdnDecodeKernel gdn_decode_choose(const KernelVariants& v, bool vec, int dv) {
  if (v.decode_general) return GdnDecodeKernel::general;
  return vec && (dv + kGdnQuadCols - 1) / kGdnQuadCols <= 65535 ? GdnDecodeKernel::quad
                                                                : GdnDecodeKernel::slice32;
}

}  // namespace df
