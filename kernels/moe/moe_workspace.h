// The workspace layout of the CUDA mixture-of-experts launchers (moe.cu): the tile plan of the experts'
// grouped GEMMs and where each buffer of a call starts. Plain C++ with no CUDA header, so that the VRAM
// planner (built without CUDA) counts exactly the bytes the launchers check for.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/fp8.h"
#include "core/torch_topk.h"

namespace df {

// Experts a layer may have: the counting sort keeps one counter per expert in shared memory.
constexpr int kMoeMaxExperts = 4096;
// Tokens per block of the counting sort: the histogram and the placement walk the same chunks.
constexpr int kMoeChunkTokens = 128;

// The MoE layer's sizes as the launchers take them.
struct MoeDims {
  int64_t H = 0;        // hidden size
  int E = 0;            // routed experts
  int k = 0;            // experts per token
  int I = 0;            // a routed expert's SwiGLU width
  int Is = 0;           // the shared expert's width, 0 without one
  bool renorm = false;  // the top-k probabilities divided by their sum
  bool fp8 = false;  // FP8 experts: e4m3 codes with scales (ops.h MoeWeights), inputs quantised per token ...
  int fp8_group = 0;  // ... (0) or per token per 128 columns (128)
};

// The input scales the FP8 experts' GEMMs read for `rows` rows of `cols` columns: one per row (fp8_group 0)
// or one per row per 128 columns laid out as core/fp8.h fp8_group_scale_index says.
inline int64_t moe_fp8_scales(int64_t rows, int64_t cols, int fp8_group) {
  return fp8_group > 0 ? fp8_group_scales_size(rows, (cols + fp8_group - 1) / fp8_group) : rows;
}

// The grouped GEMM's tiles for T tokens: expert e's pairs fill ceil(count_e / rows) tiles of `rows` rows, and
// `tiles` bounds the sum over any routing: (T·k + min(E, T·k)·(rows − 1)) / rows. rows is the largest power
// of two up to half the expected pairs per expert T·k / E, within 16..128, so the padding, at most rows − 1
// per expert, stays under about half the pairs.
struct MoeTiles {
  int rows = 0;
  int64_t tiles = 0;
};

inline MoeTiles moe_plan_tiles(int64_t T, const MoeDims& d) {
  const int64_t pairs = T * d.k, nonempty = std::min<int64_t>(d.E, pairs);
  const double per_expert = double(pairs) / double(std::max(d.E, 1));
  int rows = 16;
  while (rows < 128 && 4.0 * rows <= per_expert) rows *= 2;
  return MoeTiles{rows, (pairs + nonempty * (rows - 1)) / rows};
}

// Bump allocation of one call's buffers inside the workspace (offsets in bytes, 256-byte aligned).
struct MoeCarve {
  size_t off = 0;
  size_t take(size_t bytes) {
    const size_t at = off;
    off += (bytes + 255) / 256 * 256;
    return at;
  }
};

// The router logits' row stride: E rounded up to 4 floats (16-byte rows for cuBLASLt).
inline int64_t moe_logits_ld(int E) {
  return (E + 3) / 4 * 4;
}

// moe_route_launch's buffers: router logits f32 [T, moe_logits_ld(E)] and the (probability, expert) rows the
// top-k reorders, TopkPair [T, E].
struct MoeRouteLayout {
  size_t logits = 0, pairs = 0, bytes = 0;
};

inline MoeRouteLayout moe_route_layout(int64_t T, const MoeDims& d) {
  MoeCarve c;
  MoeRouteLayout l;
  l.logits = c.take(size_t(T * moe_logits_ld(d.E)) * sizeof(float));
  l.pairs = c.take(size_t(T) * size_t(d.E) * sizeof(TopkPair));
  l.bytes = c.off;
  return l;
}

// moe_experts_launch's buffers. hist i32 [chunks, E]: pairs of each chunk per expert, then their exclusive
// prefix over chunks; start i32 [E + 1]: each expert's first padded row; row_token i32 [R]: the token of each
// grouped row (−1: padding); pair_row i32 [T, k]: the grouped row of each pair (−1: skipped id); ptrs: the
// six pointer arrays of the two grouped GEMMs; xs bf16 [R, H]: gathered rows, then the down projections'
// outputs; gu bf16 [R, 2I]: gate | up, the SwiGLU written over the gate half; sgu bf16 [T, 2·Is] and sy bf16
// [T, H]: the shared expert's. FP8 experts (d.fp8) instead of ptrs: tile_expert i32 [tiles], each tile's
// expert; xq u8 / xq_scale f32: the codes and scales of the grouped rows (then of x, for the shared expert);
// aq / aq_scale: those of the SwiGLU outputs, routed then shared.
struct MoeExpertsLayout {
  MoeTiles tiles;
  int64_t chunks = 0, R = 0;
  size_t hist = 0, start = 0, row_token = 0, pair_row = 0, ptrs = 0, xs = 0, gu = 0, sgu = 0, sy = 0,
         tile_expert = 0, xq = 0, xq_scale = 0, aq = 0, aq_scale = 0, bytes = 0;
};

inline MoeExpertsLayout moe_experts_layout(int64_t T, const MoeDims& d) {
  const size_t bf16_bytes = 2;
  MoeCarve c;
  MoeExpertsLayout l;
  l.tiles = moe_plan_tiles(T, d);
  l.chunks = (T + kMoeChunkTokens - 1) / kMoeChunkTokens;
  l.R = l.tiles.tiles * l.tiles.rows;
  l.hist = c.take(size_t(l.chunks) * size_t(d.E) * sizeof(int32_t));
  l.start = c.take(size_t(d.E + 1) * sizeof(int32_t));
  l.row_token = c.take(size_t(l.R) * sizeof(int32_t));
  l.pair_row = c.take(size_t(T) * size_t(d.k) * sizeof(int32_t));
  if (d.fp8) {
    const int64_t T_s = d.Is > 0 ? T : 0;
    l.tile_expert = c.take(size_t(l.tiles.tiles) * sizeof(int32_t));
    l.xq = c.take(size_t(l.R) * size_t(d.H));
    l.xq_scale = c.take(size_t(moe_fp8_scales(l.R, d.H, d.fp8_group)) * sizeof(float));
    l.aq = c.take(size_t(std::max(l.R * d.I, T_s * d.Is)));
    l.aq_scale = c.take(
        size_t(std::max(moe_fp8_scales(l.R, d.I, d.fp8_group), moe_fp8_scales(T_s, d.Is, d.fp8_group))) *
        sizeof(float));
  } else {
    l.ptrs = c.take(6 * size_t(l.tiles.tiles) * sizeof(void*));
  }
  l.xs = c.take(size_t(l.R) * size_t(d.H) * bf16_bytes);
  l.gu = c.take(size_t(l.R) * 2 * size_t(d.I) * bf16_bytes);
  if (d.Is > 0) {
    l.sgu = c.take(size_t(T) * 2 * size_t(d.Is) * bf16_bytes);
    l.sy = c.take(size_t(T) * size_t(d.H) * bf16_bytes);
  }
  l.bytes = c.off;
  return l;
}

// Device scratch bytes of moe_route_launch and moe_experts_launch for up to T tokens (monotone in T): the two
// share it, the routing's buffers being dead once the ids and weights are written.
inline size_t moe_workspace_bytes(int64_t T, const MoeDims& d) {
  return std::max(moe_route_layout(T, d).bytes, moe_experts_layout(T, d).bytes);
}

}  // namespace df
