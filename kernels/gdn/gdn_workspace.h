// The workspace layout of the CUDA Gated DeltaNet prefill (gdn.cu): which bytes it needs for a batch and
// where each part starts, and the state kernel's shared memory a block. Plain C++ with no CUDA header, so
// that the VRAM planner (built without CUDA) counts exactly the bytes the launcher checks for, and the
// dispatch unit tests weigh the state kernel's forms against each device's shared memory without a GPU.
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

// Shared memory of one pipeline stage of the state kernel (gdn.cu, GdnStateSmem) at tile width d: the W, Q, K
// and U tiles (`norm`: and the gate Z) [kGdnChunk][d + 8] bf16, the masked scores [kGdnChunk][kGdnChunk + 8]
// bf16 and the row scalars [kGdnChunk].
constexpr size_t gdn_state_stage_bytes(int d, bool norm) {
  return 2 * size_t(kGdnChunk) * (size_t(norm ? 5 : 4) * size_t(d + 8) + kGdnChunk + 8) +
         kGdnRowScalarBytes * kGdnChunk;
}

// The state kernel's shared memory a block with `stages` pipeline stages (2: the next chunk's tiles are
// copied while this one is computed; 1: each tile is refilled once this chunk has read it), plus the fused
// norm's per-warp sums of squares [d / 16][kGdnChunk] and inverse rms [kGdnChunk], fp32.
constexpr size_t gdn_state_smem_bytes(int d, bool norm, int stages) {
  return size_t(stages) * gdn_state_stage_bytes(d, norm) +
         (norm ? sizeof(float) * size_t(d / 16 + 1) * kGdnChunk : 0);
}

}  // namespace df
