// The device scratch the CUDA launchers of the drafter's training ops ask for, and the cuBLASLt entry point's
// own buffers. Plain C++ with no CUDA header (like gdn_workspace.h), so that the VRAM planner, built without
// CUDA, counts exactly the bytes the launchers check for: one formula each, used by both.
#pragma once
#include <cstddef>
#include <cstdint>

namespace df {

// ---- gemm.cu --------------------------------------------------------------------------------------------
// The cuBLASLt workspace every GemmContext allocates: what the split-K and stream-K kernels ask for on
// Hopper.
constexpr size_t kGemmWorkspaceBytes = size_t(64) << 20;
// Bytes of the tuning output for a beta != 0 GEMM writing c [M, N] (row stride ldc): the timed candidates
// must not touch c, so they write a scratch of c's span, last row cut at N. The scratch only grows.
inline size_t gemm_tune_scratch_bytes(int64_t M, int64_t N, int64_t ldc, bool c_f32) {
  return size_t((M - 1) * ldc + N) * (c_f32 ? 4 : 2);
}

// ---- rmsnorm.cu, rope.cu: fixed-order parameter-gradient reductions --------------------------------------
// Row chunks of those reductions: chunk k of `rows` rows covers [k·R, (k + 1)·R), R = ceil(rows / chunks).
// A function of the shape only, so a given shape always sums in the same order.
inline int64_t column_partial_chunks(int64_t rows, int64_t cols) {
  const int64_t tiles = (cols + 255) / 256, want = (512 + tiles - 1) / tiles, by_rows = (rows + 15) / 16;
  return want < by_rows ? want : (by_rows > 0 ? by_rows : 1);
}
inline size_t rmsnorm_bwd_workspace_bytes(int64_t rows, int64_t cols) {
  return size_t(column_partial_chunks(rows, cols)) * size_t(cols) * sizeof(float);
}
inline size_t qk_norm_rope_bwd_workspace_bytes(int64_t T, int hd) {
  return size_t(column_partial_chunks(T, hd)) * size_t(hd) * sizeof(float);
}

// ---- adamw.cu: sum of squares ----------------------------------------------------------------------------
// A fixed grid whatever the GPU, so every device sums in the same order.
constexpr int kSsqThreads = 256;
constexpr int kSsqMaxBlocks = 1024;
inline int sum_squares_blocks(int64_t n) {
  const int64_t b = (n + kSsqThreads - 1) / kSsqThreads;
  return static_cast<int>(b < kSsqMaxBlocks ? (b > 0 ? b : 1) : kSsqMaxBlocks);
}
inline size_t sum_squares_workspace_bytes(int64_t n) {
  return size_t(sum_squares_blocks(n)) * sizeof(double);
}

// ---- dflash_attention.cu ---------------------------------------------------------------------------------
// The shape of one DFlash attention call (train_ops.h DFlashAttnShape, plus the row counts).
struct DFlashAttnDims {
  int64_t T = 0;   // context rows of k/v (rows [0, T)); block rows follow at T + j·B
  int64_t nb = 0;  // blocks; q/out have nb·B rows, k/v have T + nb·B rows
  int hq = 0, hkv = 0, hd = 0, block = 0, window = 0;
  float scale = 1.0f;
};
inline size_t round256(size_t n) {
  return (n + 255) / 256 * 256;
}
// The backward's two f32 softmax row-term arrays (lse·log2 e and D = rowsum(dO∘O)), one entry per query row
// and head each; 256-byte aligned.
inline size_t dflash_attention_bwd_workspace_bytes(const DFlashAttnDims& d) {
  return 2 * round256(sizeof(float) * size_t(d.nb * d.block) * size_t(d.hq));
}

// ---- lm_head_loss.cu -------------------------------------------------------------------------------------
// Where each piece of the loss workspace lives (byte offsets, 256-byte aligned) and the padded row strides:
// logits rows of a multiple of 8 elements keep every row 16-byte aligned for the vector loads and cuBLASLt.
struct LmLossLayout {
  int64_t chunk = 0, ldh = 0, ldv = 0;
  size_t idx = 0, hid = 0, tgt = 0, logits = 0, tlogits = 0, grad = 0, bytes = 0;
};

inline LmLossLayout lm_head_loss_layout(int64_t rows, int64_t H, int64_t V, int64_t chunk_rows, bool kl) {
  auto round_up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  LmLossLayout L;
  L.chunk = chunk_rows < rows ? chunk_rows : rows;
  if (L.chunk < 1) L.chunk = 1;
  L.ldh = round_up(H, 8);
  L.ldv = round_up(V, 8);
  size_t off = 0;
  auto take = [&](int64_t bytes) {
    const size_t at = off;
    off += size_t(round_up(bytes, 256));
    return at;
  };
  L.idx = take(rows * int64_t(sizeof(int32_t)));
  // hid also receives the chunk's dhidden: the gathered rows are dead once the logits exist.
  L.hid = take(L.chunk * L.ldh * 2);
  if (kl) L.tgt = take(L.chunk * L.ldh * 2);
  L.logits = take(L.chunk * L.ldv * int64_t(sizeof(float)));
  if (kl) L.tlogits = take(L.chunk * L.ldv * int64_t(sizeof(float)));
  L.grad = take(L.chunk * L.ldv * 2);  // bf16 dlogits
  L.bytes = off;
  return L;
}

inline size_t lm_head_loss_workspace_bytes(int64_t rows, int64_t H, int64_t V, int64_t chunk_rows, bool kl) {
  return lm_head_loss_layout(rows, H, V, chunk_rows, kl).bytes;
}

}  // namespace df
