// DFlash2's candidate selector on the device (train_ops.h dflash2_selector_loss and dflash2_selector_propose;
// ops/dflash2_selector.h is the math, ops/cpu/cpu_dflash2.cpp the oracle; the convolution is
// dflash2_conv.cu).
//
// The selector loss rides on DFlash's chunked lm_head pass over the rows after each block's anchor (the
// anchor slot carries no weight: those rows are gathered first and their dy rows scattered back, so the
// vocabulary GEMMs skip 1/B of the rows, as lm_head_loss's compaction does): for each chunk the logits GEMM,
// then one row kernel that splits each row over a cluster of CTAs as lm_head_loss.cu does (row_slice.cuh):
// the slice pass reduces the row for the CE and keeps the top-K of the same elements (row_topk.cuh; no second
// pass over the vocabulary), the cluster's rank 0 merges both, scores the K candidates and takes both
// cross-entropies, every CTA writes its slice's logit gradient, and rank 0 then rewrites the candidates'
// entries with the selector's terms added in f32 before the one bf16 rounding; then dy = grad·lm_head
// (+ dP·W_h). The codebook gradients are scatters by token id (token_scatter.cu): the (token, entry) keys
// are sorted and each token's entries summed in entry order by one CTA, so the bits never depend on float
// atomics.
#include <algorithm>
#include <climits>

#include "kernels/gemm/gemm.cuh"
#include "kernels/launchers.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/train/head_launch.cuh"
#include "kernels/train/row_slice.cuh"
#include "kernels/train/row_stat.cuh"
#include "kernels/train/row_topk.cuh"
#include "kernels/train_launchers.cuh"

namespace df {

using namespace head_launch;
using row_slice::row_partial;
using row_slice::row_sync;
using row_slice::slice_for_each;
using row_slice::slice_of;

static_assert(kDflash2MaxTopK <= row_topk::kMaxK, "the device top-K holds up to row_topk::kMaxK entries");

namespace {

__device__ __forceinline__ float unary_of(float logit, float mult, float softcap) {
  const float u = logit * mult;
  return softcap > 0.0f ? softcap * tanhf(u / softcap) : u;
}

__device__ __forceinline__ float unary_grad_of(float logit, float mult, float softcap) {
  if (softcap <= 0.0f) return mult;
  const float t = tanhf(logit * mult / softcap);
  return mult * (1.0f - t * t);
}

// The scatter key of entry e for token tok (token_scatter.cu).
__device__ __forceinline__ uint64_t token_key(int64_t tok, int64_t e) {
  return (uint64_t(uint32_t(tok)) << 32) | uint64_t(uint32_t(e));
}

// Warp-strided dot products of ctx [R] (shared) with the successor rows of the K candidates: score[j] =
// unary[j] + ⟨ctx, succ[cand[j]]⟩, a fixed lane order per candidate.
__device__ void selector_scores(const float* ctx, const bf16* succ, int R, int K, const int32_t* cand,
                                const float* unary, float* score) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int j = warp; j < K; j += warps) {
    const bf16* sr = succ + int64_t(cand[j]) * R;
    float s = 0.0f;
    for (int c = lane; c < R; c += 32) s += ctx[c] * __bfloat162float(sr[c]);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) score[j] = unary[j] + s;
  }
}

}  // namespace

// ---- kernels: the selector ----

// The loss walks the non-anchor rows compacted (train_workspace.h Dflash2SelectorLayout): compact row cr is
// block row idx[cr]; the row's inputs and statistics are at the block row, its selector rows and keys at cr.
struct SelectorRowArgs {
  const float* logits;  // [chunk, ld] f32
  bf16* grad;           // [chunk, ld] bf16: ∂/∂logits, the selector's candidate terms included
  int64_t ld;
  int64_t row0;        // the chunk's first compact row
  const int32_t* idx;  // [Nc] block row of each compact row
  const int32_t* labels;
  const int32_t* prev;
  const float* row_w;
  const float* proj;  // [Nc, R] f32: W_h·y
  const bf16* pred;   // [V, R]
  const bf16* succ;   // [V, R]
  int32_t* argmax;
  float* row_loss;  // [N] CE + α·CE_selector
  uint8_t* row_act;
  uint64_t* cand_keys;  // [Nc, K] candidate id << 32 | entry cr·K + j (token_scatter.cu); V: weightless row
  float* ds;            // [Nc, K] ∂/∂score
  float* ctx;           // [Nc, R] pred[prev] ⊙ proj
  uint64_t* prev_keys;  // [Nc] prev << 32 | cr; prev V for a weightless row
  float* dpr;           // [Nc, R] dctx ⊙ proj: the predecessor row's gradient
  bf16* dproj;          // [Nc, R] dctx ⊙ pred[prev]: ∂/∂(W_h·y)
  int64_t V;
  int R, K;
  float mult, softcap, alpha;
  bool stop_gradient, backward;
  int ctas;  // CTAs a row (the cluster size)
};

// One row (chunk position blockIdx.x / ctas) per cluster of `ctas` CTAs, CTA `rank` owning a slice of float4
// columns. The slice pass: the CE statistics and the slice's top-K; rank 0 merges the cluster's (statistics
// in rank order, every CTA the same bits) and takes the training candidate set (a gold label outside the
// top-K replaces the K-th), the selector's context, scores, softmax and CE; with backward, ∂/∂score and the
// rows of the selector's gradients, every CTA's second pass over its slice, and rank 0's rewrite of the
// candidates' entries. A weightless row gets argmax −1, loss 0, sentinel keys and zero gradient rows. An
// active row whose label lies outside [0, V) gets NaN loss (the CPU backend rejects such a label).
__global__ void __launch_bounds__(row_slice::kThreads) dflash2_selector_row_kernel(SelectorRowArgs a) {
  extern __shared__ float sh_ctx[];  // [R], rank 0
  __shared__ row_topk::Scratch tks;
  __shared__ RowStat red[32];
  __shared__ RowStat part;
  __shared__ float cv[kDflash2MaxTopK], un[kDflash2MaxTopK], score[kDflash2MaxTopK], dsc[kDflash2MaxTopK];
  __shared__ int32_t cid[kDflash2MaxTopK];
  __shared__ float fin[2];  // max, log Σ
  __shared__ int tgt_s;
  const int rank = int(blockIdx.x % unsigned(a.ctas));
  const int64_t i = blockIdx.x / unsigned(a.ctas), cr = a.row0 + i, r = a.idx[cr], V = a.V, V4 = (V + 3) / 4,
                L4 = a.ld / 4;
  const int K = a.K, R = a.R;
  int64_t q0, q1;
  slice_of(V, rank, a.ctas, q0, q1);
  const float w = a.row_w[r];
  const int32_t lab = a.labels[r], prv = a.prev[r];
  const float* z = a.logits + i * a.ld;
  const float4* z4 = reinterpret_cast<const float4*>(z);
  uint2* g4 = reinterpret_cast<uint2*>(a.grad + i * a.ld);
  // The row's padding float4 columns [V4, ld / 4), kept defined (the GEMM never reads them).
  const int64_t pad0 = rank == a.ctas - 1 ? V4 : L4;
  if (w == 0.0f) {  // the same in every CTA of the cluster: none waits at a barrier
    if (rank == 0) {
      if (threadIdx.x == 0) {
        a.argmax[r] = -1;
        a.row_loss[r] = 0.0f;
        a.row_act[r] = 0;
        a.prev_keys[cr] = token_key(V, cr);
      }
      for (int j = threadIdx.x; j < K; j += blockDim.x) {
        a.cand_keys[cr * K + j] = token_key(V, cr * K + j);
        a.ds[cr * K + j] = 0.0f;
      }
      if (a.backward)
        for (int c = threadIdx.x; c < R; c += blockDim.x) a.dproj[cr * R + c] = __float2bfloat16(0.0f);
    }
    if (!a.backward) return;
    for (int64_t q = q0 + threadIdx.x; q < q1; q += blockDim.x) g4[q] = make_uint2(0u, 0u);
    for (int64_t q = pad0 + threadIdx.x; q < L4; q += blockDim.x) g4[q] = make_uint2(0u, 0u);
    return;
  }
  RowStat st{-INFINITY, 0.0f, INT_MAX};
  row_topk::WarpList tl;
  row_topk::list_init(tl);
  row_topk::scratch_init(tks);
  __syncthreads();
  slice_for_each<row_slice::kUnroll<false>, false>(
      z4, nullptr, q0, q1, false, [&](int64_t qu, bool live, const float(&zv)[4], const float(&)[4]) {
        const float lo = row_topk::bar_of(tks);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int64_t t = 4 * qu + c;
          const bool in = live && t < V;
          if (in) row_stat_add(st, zv[c], int32_t(t));
          row_topk::list_offer(tl, K, in ? zv[c] : -INFINITY, in ? int32_t(t) : INT_MAX, lo, &tks.bar);
        }
      });
  st = stat_block_reduce(st, red);
  row_topk::cta_merge(tl, K, tks);
  if (threadIdx.x == 0) part = st;
  row_sync(a.ctas);
  if (threadIdx.x == 0 && (rank == 0 || a.backward)) {
    RowStat d = *row_partial(&part, 0, a.ctas);
    for (int k = 1; k < a.ctas; ++k) d = stat_merge(d, *row_partial(&part, k, a.ctas));
    fin[0] = d.m;
    fin[1] = __logf(d.s);
    if (rank == 0) a.argmax[r] = d.am;
  }
  if (rank == 0) row_topk::cluster_merge(K, a.ctas, tks, cv, cid);
  row_sync(a.ctas);  // no CTA leaves (or reuses its partials) before rank 0 has read them; fin is visible
  const bool ok = lab >= 0 && lab < V && prv >= 0 && prv < V;
  if (rank == 0) {
    if (threadIdx.x == 0) {
      int tgt = -1;
      for (int j = 0; j < K; ++j) {
        if (cid[j] >= V) cid[j] = 0, cv[j] = __int_as_float(0x7fc00000);  // unfilled: the row has NaN logits
        if (cid[j] == lab) tgt = j;
      }
      if (tgt < 0) {  // the gold label replaces the weakest candidate (the pinned peer)
        tgt = K - 1;
        cid[K - 1] = ok ? lab : 0;
        cv[K - 1] = ok ? z[lab] : 0.0f;
      }
      tgt_s = tgt;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < K; j += blockDim.x) un[j] = unary_of(cv[j], a.mult, a.softcap);
    const bf16* pr = a.pred + int64_t(ok ? prv : 0) * R;
    const float* pj = a.proj + cr * R;
    for (int c = threadIdx.x; c < R; c += blockDim.x) {
      const float x = __bfloat162float(pr[c]) * pj[c];
      sh_ctx[c] = x;
      a.ctx[cr * R + c] = x;
    }
    __syncthreads();
    selector_scores(sh_ctx, a.succ, R, K, cid, un, score);
    __syncthreads();
    if (threadIdx.x == 0) {
      const int tgt = tgt_s;
      float mx = -INFINITY;
      for (int j = 0; j < K; ++j) mx = fmaxf(mx, score[j]);
      float sum = 0.0f;
      for (int j = 0; j < K; ++j) sum += __expf(score[j] - mx);
      const float lse = mx + __logf(sum);
      const float ce = (fin[0] - (ok ? z[lab] : 0.0f)) + fin[1];
      const float ce_sel = lse - score[tgt];
      a.row_loss[r] = ok ? ce + a.alpha * ce_sel : __int_as_float(0x7fc00000);
      a.row_act[r] = 1;
      a.prev_keys[cr] = token_key(ok ? prv : 0, cr);
      for (int j = 0; j < K; ++j) {
        const float q = __expf(score[j] - lse);
        dsc[j] = a.alpha * w * (q - (j == tgt ? 1.0f : 0.0f));
        a.cand_keys[cr * K + j] = token_key(cid[j], cr * K + j);
        a.ds[cr * K + j] = dsc[j];
      }
    }
    __syncthreads();
    if (a.backward)
      for (int c = threadIdx.x; c < R; c += blockDim.x) {
        float dctx = 0.0f;
        for (int j = 0; j < K; ++j) dctx += dsc[j] * __bfloat162float(a.succ[int64_t(cid[j]) * R + c]);
        a.dpr[cr * R + c] = dctx * pj[c];
        a.dproj[cr * R + c] = __float2bfloat16(dctx * __bfloat162float(pr[c]));
      }
  }
  if (!a.backward) return;
  const float m = fin[0], l = fin[1];
  slice_for_each<row_slice::kUnroll<false>, false>(
      z4, nullptr, q0, q1, true, [&](int64_t qu, bool live, const float(&zv)[4], const float(&)[4]) {
        if (!live) return;
        float g[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int64_t t = 4 * qu + c;
          g[c] = t < V ? w * (__expf((zv[c] - m) - l) - (t == lab ? 1.0f : 0.0f)) : 0.0f;
        }
        const __nv_bfloat162 b0 = __floats2bfloat162_rn(g[0], g[1]), b1 = __floats2bfloat162_rn(g[2], g[3]);
        g4[qu] = make_uint2(*reinterpret_cast<const uint32_t*>(&b0), *reinterpret_cast<const uint32_t*>(&b1));
      });
  for (int64_t q = pad0 + threadIdx.x; q < L4; q += blockDim.x) g4[q] = make_uint2(0u, 0u);
  if (a.stop_gradient) return;
  row_sync(a.ctas);  // every slice's plain gradient is written before rank 0 rewrites the candidates' entries
  if (rank != 0) return;
  for (int j = threadIdx.x; j < K; j += blockDim.x) {
    const int64_t t = cid[j];
    const float e = z[t];
    const float g =
        w * (__expf((e - m) - l) - (t == lab ? 1.0f : 0.0f)) + dsc[j] * unary_grad_of(e, a.mult, a.softcap);
    a.grad[i * a.ld + t] = __float2bfloat16(g);
  }
}

// Block blockIdx.x: its anchor row (slot 0, which carries no weight: NaN loss if row_w says otherwise) gets
// argmax −1, loss 0, inactive and a zero dy row (dy null: forward only); idx[cr] = the block row of compact
// row cr for its B − 1 other rows.
__global__ void dflash2_anchor_rows_kernel(int B, int H, const float* row_w, int32_t* argmax, float* row_loss,
                                           uint8_t* row_act, bf16* dy, int64_t ld_dy, int32_t* idx) {
  const int64_t j = blockIdx.x, r = j * B;
  if (threadIdx.x == 0) {
    argmax[r] = -1;
    row_loss[r] = row_w[r] == 0.0f ? 0.0f : __int_as_float(0x7fc00000);
    row_act[r] = 0;
  }
  for (int k = 1 + threadIdx.x; k < B; k += blockDim.x) idx[j * (B - 1) + k - 1] = int32_t(r + k);
  if (dy)
    for (int h = threadIdx.x; h < H; h += blockDim.x) dy[r * ld_dy + h] = __float2bfloat16(0.0f);
}

// Proposal row blockIdx.x / ctas on a cluster of `ctas` CTAs: its strict top-K (ids and raw logits). A row
// with fewer than K non-NaN logits fills its last places with id 0 and a NaN value, as the selector loss
// does, so that the walk never indexes a codebook with the unfilled id.
__global__ void __launch_bounds__(row_slice::kThreads)
    dflash2_topk_rows_kernel(const float* logits, int64_t ld, int64_t V, int K, int ctas, int32_t* cand,
                             float* cval) {
  __shared__ row_topk::Scratch tks;
  __shared__ float out_v[kDflash2MaxTopK];
  __shared__ int32_t out_id[kDflash2MaxTopK];
  const int rank = int(blockIdx.x % unsigned(ctas));
  const int64_t i = blockIdx.x / unsigned(ctas);
  int64_t q0, q1;
  slice_of(V, rank, ctas, q0, q1);
  row_topk::WarpList tl;
  row_topk::list_init(tl);
  row_topk::scratch_init(tks);
  __syncthreads();
  slice_for_each<row_slice::kUnroll<false>, false>(
      reinterpret_cast<const float4*>(logits + i * ld), nullptr, q0, q1, false,
      [&](int64_t qu, bool live, const float(&zv)[4], const float(&)[4]) {
        const float lo = row_topk::bar_of(tks);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int64_t t = 4 * qu + c;
          const bool in = live && t < V;
          row_topk::list_offer(tl, K, in ? zv[c] : -INFINITY, in ? int32_t(t) : INT_MAX, lo, &tks.bar);
        }
      });
  row_topk::cta_merge(tl, K, tks);
  row_sync(ctas);
  if (rank == 0) {
    row_topk::cluster_merge(K, ctas, tks, out_v, out_id);
    for (int j = threadIdx.x; j < K; j += blockDim.x) {
      const bool filled = out_id[j] < V;
      cand[i * K + j] = filled ? out_id[j] : 0;
      cval[i * K + j] = filled ? out_v[j] : __int_as_float(0x7fc00000);
    }
  }
  row_sync(ctas);  // no CTA leaves before rank 0 has read its list
}

// The greedy lattice walk of one block on one CTA: slot k scores its candidates with the previous slot's
// choice (tok[0] the anchor's token) and takes the first best; tok[k + 1] = that choice.
__global__ void __launch_bounds__(kRowThreads)
    dflash2_walk_kernel(const int32_t* cand, const float* cval, const float* proj, const bf16* pred,
                        const bf16* succ, int n, int R, int K, float mult, float softcap, int32_t* tok) {
  extern __shared__ float sh_ctx[];  // [R]
  __shared__ float un[kDflash2MaxTopK], score[kDflash2MaxTopK];
  for (int k = 0; k < n; ++k) {
    const int32_t prev = tok[k];
    for (int c = threadIdx.x; c < R; c += blockDim.x)
      sh_ctx[c] = __bfloat162float(pred[int64_t(prev) * R + c]) * proj[int64_t(k) * R + c];
    for (int j = threadIdx.x; j < K; j += blockDim.x) un[j] = unary_of(cval[k * K + j], mult, softcap);
    __syncthreads();
    selector_scores(sh_ctx, succ, R, K, cand + k * K, un, score);
    __syncthreads();
    if (threadIdx.x == 0) {
      int best = 0;
      for (int j = 1; j < K; ++j)
        if (score[j] > score[best]) best = j;
      tok[k + 1] = cand[k * K + best];
    }
    __syncthreads();
  }
}

// ---- launchers ----

namespace {

void check_selector(const char* op, const Dflash2SelectorShape& d) {
  DF_CHECK(
      d.nb >= 0 && d.B >= 1 && d.H >= 1 && d.V >= 1 && d.R >= 1 && d.R <= kDflash2MaxRank && d.K >= 1 &&
          d.K <= kDflash2MaxTopK && d.K <= d.V && d.nb * d.B * d.K < int64_t(UINT32_MAX) && d.mult > 0.0f &&
          d.softcap >= 0.0f,
      "%s: bad selector shape nb %lld B %d H %d V %d rank %d (≤ %d) top_k %d (≤ %d and ≤ V) multiplier %g "
      "softcap %g",
      op, (long long)d.nb, d.B, d.H, d.V, d.R, kDflash2MaxRank, d.K, kDflash2MaxTopK, double(d.mult),
      double(d.softcap));
}

// out = beta·out over n floats (beta 1: untouched).
void scale_flat(float* out, int64_t n, float beta, cudaStream_t stream) {
  if (beta == 0.0f)
    DF_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(n) * 4, stream));
  else if (beta != 1.0f)
    column_sum_launch(nullptr, 0, n, out, beta, stream);
}

}  // namespace

void dflash2_topk_rows_launch(const float* logits, int64_t ld, int64_t V, int K, int64_t n, int32_t* cand,
                              float* cval, cudaStream_t stream) {
  DF_CHECK(K >= 1 && K <= kDflash2MaxTopK && K <= V && V <= INT_MAX && ld >= V && ld % 4 == 0 && n >= 0 &&
               reinterpret_cast<uintptr_t>(logits) % 16 == 0,
           "dflash2_topk_rows_launch: top_k %d (1..%d, ≤ V), V %lld, row stride %lld (≥ V, a multiple of 4, "
           "rows 16-byte aligned), rows %lld",
           K, kDflash2MaxTopK, (long long)V, (long long)ld, (long long)n);
  if (n == 0) return;
  const int ctas = row_slice::row_cluster_size(dflash2_topk_rows_kernel, V, 0);
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = row_slice::row_config(ctas, n, 0, stream, &attr);
  DF_CUDA_CHECK(cudaLaunchKernelEx(&cfg, dflash2_topk_rows_kernel, logits, ld, V, K, ctas, cand, cval));
}

size_t dflash2_selector_workspace_bytes(const Dflash2SelectorShape& d, int64_t chunk_rows) {
  return dflash2_selector_layout(d.nb * d.B, d.B, d.H, d.V, d.R, d.K, chunk_rows).bytes;
}

void dflash2_selector_loss_launch(GemmContext* gemm, const Dflash2SelectorShape& d, const bf16* y,
                                  int64_t ld_y, const bf16* lm_head, const Dflash2SelectorWeightPtrs& w,
                                  const int32_t* labels, const int32_t* prev, const float* row_w, float alpha,
                                  bool stop_gradient, bool backward, float beta_dw, int32_t* argmax, bf16* dy,
                                  int64_t ld_dy, const Dflash2SelectorGradPtrs& dw, double* stats,
                                  int64_t chunk_rows, void* ws, size_t ws_bytes, cudaStream_t stream) {
  const char* op = "dflash2_selector_loss_launch";
  check_selector(op, d);
  const int64_t N = d.nb * d.B, V = d.V;
  const int H = d.H, R = d.R, K = d.K;
  DF_CHECK(ld_y >= H && (!backward || ld_dy >= H) && chunk_rows >= 1,
           "%s: a row stride is shorter than H %d (y %lld, dy %lld), or chunk_rows %lld < 1", op, H,
           (long long)ld_y, (long long)ld_dy, (long long)chunk_rows);
  DF_CHECK(gemm && y && lm_head && w.pred && w.succ && w.proj && labels && prev && row_w && argmax && stats &&
               (!backward || (dy && dw.pred && dw.succ && dw.proj)),
           "%s: null pointer argument", op);
  const Dflash2SelectorLayout L = dflash2_selector_layout(N, d.B, H, V, R, K, chunk_rows);
  const int64_t Nc = L.Nc;
  if (backward) {  // the scatters add into the codebook gradients
    scale_flat(dw.pred, V * R, beta_dw, stream);
    scale_flat(dw.succ, V * R, beta_dw, stream);
    if (Nc == 0) scale_flat(dw.proj, int64_t(R) * H, beta_dw, stream);
  }
  if (N == 0) return;
  check_ws(op, ws, ws_bytes, L.bytes);
  int32_t* idx = at<int32_t>(ws, L.idx);
  bf16* yc = at<bf16>(ws, L.yc);
  float* proj = at<float>(ws, L.proj);
  float* logits = at<float>(ws, L.logits);
  bf16* grad = at<bf16>(ws, L.grad);
  float* dyf = at<float>(ws, L.dyf);
  bf16* dyc = at<bf16>(ws, L.dyc);
  bf16* dproj = at<bf16>(ws, L.dproj);
  float* row_loss = at<float>(ws, L.row_loss);
  uint8_t* row_act = at<uint8_t>(ws, L.row_act);
  dflash2_anchor_rows_kernel<<<unsigned(d.nb), kThreads, 0, stream>>>(
      d.B, H, row_w, argmax, row_loss, row_act, backward ? dy : nullptr, ld_dy, idx);
  DF_CUDA_CHECK_LAUNCH("dflash2_anchor_rows_kernel");
  SelectorRowArgs ra{logits,
                     grad,
                     L.ldv,
                     0,
                     idx,
                     labels,
                     prev,
                     row_w,
                     proj,
                     w.pred,
                     w.succ,
                     argmax,
                     row_loss,
                     row_act,
                     at<uint64_t>(ws, L.cand_keys),
                     at<float>(ws, L.ds),
                     at<float>(ws, L.ctx),
                     at<uint64_t>(ws, L.prev_keys),
                     at<float>(ws, L.dpr),
                     dproj,
                     V,
                     R,
                     K,
                     d.mult,
                     d.softcap,
                     alpha,
                     stop_gradient,
                     backward,
                     1};
  const size_t smem = size_t(R) * sizeof(float);
  ra.ctas = row_slice::row_cluster_size(dflash2_selector_row_kernel, V, smem);
  if (Nc > 0) {
    row_copy_launch(y, ld_y, yc, L.ldh, idx, Nc, H, false, stream);
    gemm_launch_ex(gemm, yc, L.ldh, false, w.proj, H, true, proj, R, true, Nc, R, H, 1.0f, 0.0f, stream);
  }
  for (int64_t p0 = 0; p0 < Nc; p0 += L.chunk) {
    const int64_t n = std::min(L.chunk, Nc - p0);
    gemm_launch_ex(gemm, yc + p0 * L.ldh, L.ldh, false, lm_head, H, true, logits, L.ldv, true, n, V, H, 1.0f,
                   0.0f, stream);
    ra.row0 = p0;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = row_slice::row_config(ra.ctas, n, smem, stream, &attr);
    DF_CUDA_CHECK(cudaLaunchKernelEx(&cfg, dflash2_selector_row_kernel, ra));
    if (!backward) continue;
    if (stop_gradient) {  // the selector term stays out of dy: dy = grad·lm_head alone
      gemm_launch_ex(gemm, grad, L.ldv, false, lm_head, H, false, dyc, L.ldh, false, n, H, V, 1.0f, 0.0f,
                     stream);
    } else {
      gemm_launch_ex(gemm, grad, L.ldv, false, lm_head, H, false, dyf, L.ldh, true, n, H, V, 1.0f, 0.0f,
                     stream);
      gemm_launch_ex(gemm, dproj + p0 * R, R, false, w.proj, H, false, dyf, L.ldh, true, n, H, R, 1.0f, 1.0f,
                     stream);
      cast_launch(dyf, true, L.ldh, dyc, false, L.ldh, n, H, stream);
    }
    row_copy_launch(dyc, L.ldh, dy, ld_dy, idx + p0, n, H, true, stream);
  }
  LossRowDims sd;
  sd.nb = d.nb;
  sd.block = d.B;
  sd.weights_given = true;
  loss_row_stats_launch(labels, row_act, row_loss, row_loss, argmax, sd, const_cast<float*>(row_w), stats,
                        stream);
  if (!backward || Nc == 0) return;
  gemm_launch_ex(gemm, dproj, R, true, yc, L.ldh, false, dw.proj, H, true, R, H, Nc, 1.0f, beta_dw, stream);
  // The codebook gradients: the successor rows by candidate, the predecessor rows by previous token, each
  // sorted with its padding (all ones) after the row kernels wrote the keys.
  const int64_t nc = token_sort_keys(Nc * K), np = token_sort_keys(Nc);
  DF_CUDA_CHECK(cudaMemsetAsync(ra.cand_keys + Nc * K, 0xff, size_t(nc - Nc * K) * 8, stream));
  DF_CUDA_CHECK(cudaMemsetAsync(ra.prev_keys + Nc, 0xff, size_t(np - Nc) * 8, stream));
  token_sort_launch(ra.cand_keys, nc, stream);
  token_row_sum_launch(ra.cand_keys, Nc * K, V, ra.ds, ra.ctx, K, R, dw.succ, stream);
  token_sort_launch(ra.prev_keys, np, stream);
  token_row_sum_launch(ra.prev_keys, Nc, V, nullptr, ra.dpr, 1, R, dw.pred, stream);
}

const int32_t* dflash2_selector_propose_launch(GemmContext* gemm, const Dflash2SelectorShape& d,
                                               const bf16* y, int64_t ld_y, const bf16* lm_head,
                                               const Dflash2SelectorWeightPtrs& w, int32_t first, void* ws,
                                               size_t ws_bytes, cudaStream_t stream) {
  const char* op = "dflash2_selector_propose_launch";
  check_selector(op, d);
  DF_CHECK(
      d.nb == 1 && d.B >= 2 && ld_y >= d.H && first >= 0 && first < d.V,
      "%s: one block of at least 2 rows (nb %lld, B %d), y stride %lld ≥ H %d, first token %d in [0, %d)", op,
      (long long)d.nb, d.B, (long long)ld_y, d.H, first, d.V);
  DF_CHECK(gemm && y && lm_head && w.pred && w.succ && w.proj, "%s: null pointer argument", op);
  const int n = d.B - 1, H = d.H, R = d.R, K = d.K;
  const Dflash2ProposeLayout L = dflash2_propose_layout(d.B, d.V, R, K);
  check_ws(op, ws, ws_bytes, L.bytes);
  float* logits = at<float>(ws, L.logits);
  float* proj = at<float>(ws, L.proj);
  int32_t* cand = at<int32_t>(ws, L.cand);
  float* cval = at<float>(ws, L.cval);
  int32_t* tok = at<int32_t>(ws, L.tok);
  const bf16* z = y + ld_y;  // rows 1..B−1: the slots after the anchor
  gemm_launch_ex(gemm, z, ld_y, false, lm_head, H, true, logits, L.ldv, true, n, d.V, H, 1.0f, 0.0f, stream);
  gemm_launch_ex(gemm, z, ld_y, false, w.proj, H, true, proj, R, true, n, R, H, 1.0f, 0.0f, stream);
  dflash2_topk_rows_launch(logits, L.ldv, d.V, K, n, cand, cval, stream);
  // From pageable memory: the copy has read `first` when it returns.
  DF_CUDA_CHECK(cudaMemcpyAsync(tok, &first, sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  dflash2_walk_kernel<<<1, kRowThreads, size_t(R) * sizeof(float), stream>>>(cand, cval, proj, w.pred, w.succ,
                                                                             n, R, K, d.mult, d.softcap, tok);
  DF_CUDA_CHECK_LAUNCH("dflash2_walk_kernel");
  return tok;
}

}  // namespace df
