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

// x rounded up to a multiple of m, and the carving of a workspace into 256-byte aligned pieces in order (take
// returns a piece's byte offset, off the bytes so far): the layouts below are built with them.
inline int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}
struct WorkspaceCarver {
  size_t off = 0;
  size_t take(int64_t bytes) {
    const size_t at = off;
    off += size_t(round_up(bytes, 256));
    return at;
  }
};

// ---- the drafter heads' statistics rows (head_launch.cuh HeadStatRows) ------------------------------------
// Where a head's N statistics rows live in its workspace (byte offsets): loss and weight f32, label and
// argmax i32, active u8. Carved here, in the CUDA-free layout header, so the planner counts them;
// head_launch.cuh's head_stat_rows turns them into the kernels' pointers.
struct HeadStatOffsets {
  size_t loss = 0, w = 0, lab = 0, am = 0, act = 0;
};
inline HeadStatOffsets head_stat_offsets_take(WorkspaceCarver& ws, int64_t N) {
  HeadStatOffsets o;
  o.loss = ws.take(N * 4);
  o.w = ws.take(N * 4);
  o.lab = ws.take(N * 4);
  o.am = ws.take(N * 4);
  o.act = ws.take(N);
  return o;
}

// ---- lm_head_loss.cu -------------------------------------------------------------------------------------
// Where each piece of the loss workspace lives (byte offsets, 256-byte aligned) and the padded row strides:
// logits rows of a multiple of 8 elements keep every row 16-byte aligned for the vector loads and cuBLASLt.
struct LmLossLayout {
  int64_t chunk = 0, ldh = 0, ldv = 0;
  size_t idx = 0, hid = 0, tgt = 0, logits = 0, tlogits = 0, grad = 0, bytes = 0;
};

inline LmLossLayout lm_head_loss_layout(int64_t rows, int64_t H, int64_t V, int64_t chunk_rows, bool kl) {
  LmLossLayout L;
  L.chunk = chunk_rows < rows ? chunk_rows : rows;
  if (L.chunk < 1) L.chunk = 1;
  L.ldh = round_up(H, 8);
  L.ldv = round_up(V, 8);
  WorkspaceCarver ws;
  auto take = [&](int64_t bytes) { return ws.take(bytes); };
  L.idx = take(rows * int64_t(sizeof(int32_t)));
  // hid also receives the chunk's dhidden: the gathered rows are dead once the logits exist.
  L.hid = take(L.chunk * L.ldh * 2);
  if (kl) L.tgt = take(L.chunk * L.ldh * 2);
  L.logits = take(L.chunk * L.ldv * int64_t(sizeof(float)));
  if (kl) L.tlogits = take(L.chunk * L.ldv * int64_t(sizeof(float)));
  L.grad = take(L.chunk * L.ldv * 2);  // bf16 dlogits
  L.bytes = ws.off;
  return L;
}

inline size_t lm_head_loss_workspace_bytes(int64_t rows, int64_t H, int64_t V, int64_t chunk_rows, bool kl) {
  return lm_head_loss_layout(rows, H, V, chunk_rows, kl).bytes;
}

// ---- domino_head.cu --------------------------------------------------------------------------------------
// Domino's head over nb blocks of B rows (N = nb·B): what the forward keeps for the backward (the GRU's input
// projection, states and gates, the correction MLP's input [y ; h] and activations), one chunk of base
// logits and corrections (final = base + correction) with the bf16 gradients of both logits, and the
// backward's buffers. Byte offsets, 256-byte aligned; logits and [y ; h] rows padded to a multiple of 8
// elements (16-byte aligned rows for the vector loads and cuBLASLt). Two f32 arrays a chunk instead of
// lm_head_loss's one: the chunk is half of chunk_rows, so the scratch stays about lm_head_loss's.
struct DominoLayout {
  int64_t N = 0, chunk = 0, ldv = 0, ldf = 0;
  size_t xi = 0, hh = 0, hs = 0, hsb = 0, gates = 0, fcat = 0, m = 0, a = 0;  // forward
  size_t base = 0, corr = 0, gbase = 0, gfin = 0;                             // one chunk of logits
  size_t da = 0, dm = 0, df = 0, dh = 0, dhs = 0, dgi = 0, dgh = 0;           // backward
  HeadStatOffsets stat;                                                       // statistics rows
  size_t bytes = 0;
};

inline DominoLayout domino_head_layout(int64_t nb, int64_t B, int64_t H, int64_t G, int64_t E, int64_t V,
                                       int64_t chunk_rows) {
  DominoLayout L;
  L.N = nb * B;
  L.chunk = chunk_rows / 2 < L.N ? chunk_rows / 2 : L.N;
  if (L.chunk < 1) L.chunk = 1;
  L.ldv = round_up(V, 8);
  L.ldf = round_up(H + G, 8);
  WorkspaceCarver ws;
  auto take = [&](int64_t bytes) { return ws.take(bytes); };
  const int64_t N = L.N, f4 = 4, b2 = 2;
  L.xi = take(N * 3 * G * f4);
  L.hh = take(nb * 3 * G * f4);
  L.hs = take((B + 1) * nb * G * f4);  // state t + 1 after input t; state 0 is h_{-1} = 0
  L.hsb = take((B + 1) * nb * G * b2);
  L.gates = take(4 * B * nb * G * f4);  // r, u, n, W_hn·h per step
  L.fcat = take(N * L.ldf * b2);
  L.m = take(N * E * f4);
  L.a = take(N * E * b2);
  L.base = take(L.chunk * L.ldv * f4);
  L.corr = take(L.chunk * L.ldv * f4);
  L.gbase = take(L.chunk * L.ldv * b2);
  L.gfin = take(L.chunk * L.ldv * b2);
  L.da = take(N * E * f4);
  L.dm = take(N * E * b2);
  L.df = take(N * L.ldf * f4);
  L.dh = take(nb * G * f4);
  L.dhs = take(B * nb * G * f4);
  L.dgi = take(N * 3 * G * b2);
  L.dgh = take(B * nb * 3 * G * b2);
  L.stat = head_stat_offsets_take(ws, N);
  L.bytes = ws.off;
  return L;
}

inline size_t domino_head_workspace_bytes(int64_t nb, int64_t B, int64_t H, int64_t G, int64_t E, int64_t V,
                                          int64_t chunk_rows) {
  return domino_head_layout(nb, B, H, G, E, V, chunk_rows).bytes;
}

// Domino's greedy proposals for one block: the B base logits rows, one final logits row, the GRU's step
// buffers and the B tokens.
struct DominoProposeLayout {
  int64_t ldv = 0, ldf = 0;
  size_t base = 0, fin = 0, x = 0, xi = 0, hh = 0, h = 0, hb = 0, f = 0, m = 0, a = 0, tok = 0, bytes = 0;
};

inline DominoProposeLayout domino_propose_layout(int64_t B, int64_t H, int64_t G, int64_t E, int64_t V) {
  DominoProposeLayout L;
  L.ldv = round_up(V, 8);
  L.ldf = round_up(H + G, 8);
  WorkspaceCarver ws;
  auto take = [&](int64_t bytes) { return ws.take(bytes); };
  L.base = take(B * L.ldv * 4);
  L.fin = take(L.ldv * 4);
  L.x = take(H * 2);
  L.xi = take(3 * G * 4);
  L.hh = take(3 * G * 4);
  L.h = take(G * 4);
  L.hb = take(G * 2);
  L.f = take(L.ldf * 2);
  L.m = take(E * 4);
  L.a = take(E * 2);
  L.tok = take(B * 4);
  L.bytes = ws.off;
  return L;
}

// ---- token_scatter.cu: the token-keyed gradient scatters (DSpark's W1, DFlash2's codebooks) -------------
// Keys a sort of M entries takes: M padded to a power of two (the bitonic sort sorts in place).
inline int64_t token_sort_keys(int64_t M) {
  int64_t n = 1;
  while (n < M) n *= 2;
  return n;
}

// ---- dflash2_conv.cu, dflash2_selector.cu -----------------------------------------------------------
// The selector's top-K (row_topk.cuh holds up to 64) and its context row [R] in shared memory.
constexpr int kDflash2MaxTopK = 64;
constexpr int kDflash2MaxRank = 8192;

// The convolution backward's ∂/∂base row-chunk partials [chunks, taps·H]: chunks of 16 rows (enough CTAs to
// stream the two operands), at most 512 chunks. A function of the shape only, so a shape always sums in the
// same order.
inline int64_t dflash2_conv_dbase_chunks(int64_t rows) {
  const int64_t c = (rows + 15) / 16;
  return c < 1 ? 1 : (c > 512 ? 512 : c);
}
inline size_t dflash2_conv_bwd_workspace_bytes(int64_t rows, int64_t H, int64_t taps) {
  return size_t(dflash2_conv_dbase_chunks(rows)) * size_t(taps * H) * sizeof(float);
}

// The selector loss over N = nb·B block rows walks the Nc = nb·(B − 1) rows after the anchors (an anchor's
// slot carries no weight), gathered: their block-row index, the gathered y, W_h·y, one chunk of logits with
// its bf16 gradient and the dy rows (f32, then bf16 for the scatter), the statistics of every block row, the
// candidates' (token, entry) scatter keys and the predecessors' (each padded by token_sort_keys), ∂/∂score,
// and the context and predecessor gradient rows the scatters read.
struct Dflash2SelectorLayout {
  int64_t Nc = 0, chunk = 0, ldv = 0, ldh = 0;
  size_t idx = 0, yc = 0, proj = 0, logits = 0, grad = 0, dyf = 0, dyc = 0, dproj = 0;
  size_t row_loss = 0, row_act = 0;
  size_t cand_keys = 0, ds = 0, ctx = 0, prev_keys = 0, dpr = 0, bytes = 0;
};

inline Dflash2SelectorLayout dflash2_selector_layout(int64_t N, int64_t B, int64_t H, int64_t V, int64_t R,
                                                     int64_t K, int64_t chunk_rows) {
  Dflash2SelectorLayout L;
  L.Nc = B > 0 ? N / B * (B - 1) : 0;
  const int64_t Nc = L.Nc;
  L.chunk = chunk_rows < Nc ? chunk_rows : Nc;
  if (L.chunk < 1) L.chunk = 1;
  L.ldv = round_up(V, 8);
  L.ldh = round_up(H, 8);
  WorkspaceCarver ws;
  auto take = [&](int64_t bytes) { return ws.take(bytes); };
  const int64_t f4 = 4, b2 = 2;
  L.idx = take(Nc * 4);
  L.yc = take(Nc * L.ldh * b2);
  L.proj = take(Nc * R * f4);
  L.logits = take(L.chunk * L.ldv * f4);
  L.grad = take(L.chunk * L.ldv * b2);
  L.dyf = take(L.chunk * L.ldh * f4);
  L.dyc = take(L.chunk * L.ldh * b2);
  L.dproj = take(Nc * R * b2);
  L.row_loss = take(N * f4);
  L.row_act = take(N);
  L.cand_keys = take(token_sort_keys(Nc * K) * 8);
  L.ds = take(Nc * K * f4);
  L.ctx = take(Nc * R * f4);
  L.prev_keys = take(token_sort_keys(Nc) * 8);
  L.dpr = take(Nc * R * f4);
  L.bytes = ws.off;
  return L;
}

// One block's proposals: the logits and W_h·y of its B − 1 slots, their candidates and the B tokens.
struct Dflash2ProposeLayout {
  int64_t ldv = 0;
  size_t logits = 0, proj = 0, cand = 0, cval = 0, tok = 0, bytes = 0;
};

inline Dflash2ProposeLayout dflash2_propose_layout(int64_t B, int64_t V, int64_t R, int64_t K) {
  Dflash2ProposeLayout L;
  L.ldv = round_up(V, 8);
  WorkspaceCarver ws;
  auto take = [&](int64_t bytes) { return ws.take(bytes); };
  L.logits = take(B * L.ldv * 4);
  L.proj = take(B * R * 4);
  L.cand = take(B * K * 4);
  L.cval = take(B * K * 4);
  L.tok = take(B * 4);
  L.bytes = ws.off;
  return L;
}

}  // namespace df
