// The workspace layout of the CUDA Gated DeltaNet prefill (gdn.cu): which bytes it needs for a batch and
// where each part starts. Plain C++ with no CUDA header, the one such file in kernels/, so that the VRAM
// planner (built without CUDA) counts exactly the bytes the launcher checks for.
#pragma once
#include <cstddef>
#include <cstdint>

namespace df {

// Tokens per chunk of the chunked form; the workspace holds one row of masked scores per token of a chunk.
constexpr int kGdnChunk = 64;
// Bytes of the per-(token, head) row scalars (one float4: decayed q scale, k decay, chunk decay, unused).
constexpr size_t kGdnRowScalarBytes = 16;

// Head tile width the kernels are instantiated for: max(dk, dv) rounded up to 32, 64 or 128.
inline int gdn_prefill_tile_dim(int dk, int dv) {
  const int d = dk > dv ? dk : dv;
  return d <= 32 ? 32 : d <= 64 ? 64 : 128;
}

// Byte offsets into the workspace. Rows follow the packed tokens (T·nv of them): W and U [T, nv, D] bf16,
// masked scores [T, nv, kGdnChunk] bf16, row scalars [T, nv] float4. Every offset is a multiple of 16
// (D >= 32), so a 16-byte aligned base keeps the float4 and 16-byte vector accesses aligned.
struct GdnWorkspaceLayout {
  size_t w = 0, u = 0, scores = 0, scalars = 0, total = 0;
};

inline GdnWorkspaceLayout gdn_prefill_workspace_layout(int64_t T, int nv, int dk, int dv) {
  const size_t rows = static_cast<size_t>(T) * static_cast<size_t>(nv);
  const size_t wu = 2 * rows * static_cast<size_t>(gdn_prefill_tile_dim(dk, dv));
  GdnWorkspaceLayout l;
  l.u = wu;
  l.scores = 2 * wu;
  l.scalars = l.scores + 2 * rows * kGdnChunk;
  l.total = l.scalars + kGdnRowScalarBytes * rows;
  return l;
}

// Head dims the chunked kernels are built for; others run the token recurrence, which needs no workspace.
inline bool gdn_prefill_chunked_shape(int dk, int dv) {
  return dk > 0 && dv > 0 && dk <= 128 && dv <= 128 && dk % 8 == 0 && dv % 8 == 0;
}

// Bytes gdn_prefill_launch needs for a batch of T packed tokens (any split into sequences).
inline size_t gdn_prefill_workspace_bytes(int64_t T, int nv, int dk, int dv) {
  return gdn_prefill_chunked_shape(dk, dv) ? gdn_prefill_workspace_layout(T, nv, dk, dv).total : 0;
}

}  // namespace df
