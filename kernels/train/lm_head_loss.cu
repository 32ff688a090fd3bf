// The drafter's loss through the frozen lm_head on the device (train_ops.h lm_head_loss, oracle in
// cpu_train_ops.cpp): active rows are compacted by a scan on the device, then each chunk of them is gathered,
// multiplied by lm_headᵀ into f32 logits, reduced by one row kernel and multiplied back for dhidden, so the
// logits exist for at most chunk_rows rows. Everything is queued on one stream: no sync, no allocation.
#include <algorithm>
#include <climits>
#include <cstdio>

#include "kernels/dispatch/dispatch.h"
#include "kernels/gemm/gemm.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/train/row_slice.cuh"
#include "kernels/train/row_stat.cuh"
#include "kernels/train_launchers.cuh"

namespace df {

using namespace row_slice;

namespace {

constexpr int kScanThreads = 1024;  // one block compacts every row; 32 warps = one warp's worth of sums
constexpr int kCopyThreads = 256;
// The row kernel is compiled for CTAs of up to 1024 threads, which bounds its registers; it runs
// row_slice::kThreads.
constexpr int kRowMaxThreads = 1024;

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

// ---- kernels ----

// idx[p] for p < n_active = the p-th active row in row order; idx[p] = −1 for p ≥ n_active. One block: each
// thread counts a contiguous run of rows, a block scan turns the counts into output offsets.
__global__ void __launch_bounds__(kScanThreads)
    lm_loss_compact_kernel(const uint8_t* active, int rows, int32_t* idx) {
  __shared__ int warp_incl[32];
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int64_t per = (int64_t(rows) + kScanThreads - 1) / kScanThreads;
  const int r0 = int(min(int64_t(rows), t * per)), r1 = int(min(int64_t(rows), r0 + per));
  int cnt = 0;
  for (int r = r0; r < r1; ++r) cnt += active[r] != 0;
  int incl = cnt;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_incl[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int s = warp_incl[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    warp_incl[lane] = s;
  }
  __syncthreads();
  const int total = warp_incl[31];
  int before = incl - cnt + (warp > 0 ? warp_incl[warp - 1] : 0);  // active rows before r0
  for (int r = r0; r < r1; ++r) {
    if (active[r])
      idx[before++] = r;
    else
      idx[total + (r - before)] = -1;  // r − before inactive rows precede r
  }
}

// Outputs of the inactive rows: loss 0, p_label 0, argmax −1, dhidden 0 (active rows are written later).
__global__ void lm_loss_clear_kernel(const uint8_t* active, float* loss, float* p_label, int32_t* argmax,
                                     bf16* dhidden, int64_t ld, int64_t H) {
  const int64_t r = blockIdx.x;
  if (active[r]) return;
  if (threadIdx.x == 0) {
    loss[r] = 0.0f;
    p_label[r] = 0.0f;
    argmax[r] = -1;
  }
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) dhidden[r * ld + h] = __float2bfloat16(0.0f);
}

// One chunk position per block. Gather: dst row i = src row idx[i] (zeros for a dead position, so the GEMMs
// read defined values). Scatter: dst row idx[i] = src row i (dead positions skipped). VEC = 8 moves 16 bytes.
template <int VEC>
__global__ void lm_loss_rows_kernel(const bf16* src, int64_t ld_src, bf16* dst, int64_t ld_dst,
                                    const int32_t* idx, int64_t H, bool scatter) {
  const int64_t i = blockIdx.x;
  const int32_t r = idx[i];
  if (scatter && r < 0) return;
  const bf16* s = src + (scatter ? i : int64_t(max(r, 0))) * ld_src;  // a dead row is never read
  bf16* d = dst + (scatter ? int64_t(r) : i) * ld_dst;
  for (int64_t h = threadIdx.x; h < H / VEC; h += blockDim.x) {
    if constexpr (VEC == 8) {
      reinterpret_cast<uint4*>(d)[h] = r < 0 ? make_uint4(0, 0, 0, 0) : reinterpret_cast<const uint4*>(s)[h];
    } else {
      d[h] = r < 0 ? __float2bfloat16(0.0f) : s[h];
    }
  }
}

// The target row of the KL: max m, Σ e with e = exp(y − m), and Σ e·(y − z) (the draft logit z).
struct TgtStat {
  float m;
  float s;
  float a;
};

__device__ __forceinline__ void tgt_stat_add(TgtStat& st, float y, float z) {
  if (y > st.m) {
    const float f = __expf(st.m - y);
    st.s *= f;
    st.a *= f;
    st.m = y;
  }
  const float e = __expf(y - st.m);
  st.s += e;
  st.a += e * (y - z);
}

__device__ __forceinline__ TgtStat stat_merge(const TgtStat& x, const TgtStat& y) {
  const float M = fmaxf(x.m, y.m), fx = stat_rescale(x.m, M), fy = stat_rescale(y.m, M);
  return {M, x.s * fx + y.s * fy, x.a * fx + y.a * fy};
}

__device__ __forceinline__ TgtStat stat_shfl_down(const TgtStat& v, int o) {
  return {__shfl_down_sync(0xffffffffu, v.m, o), __shfl_down_sync(0xffffffffu, v.s, o),
          __shfl_down_sync(0xffffffffu, v.a, o)};
}

struct RowArgs {
  const float* logits;   // [chunk, ld] f32
  const float* tlogits;  // [chunk, ld] f32, KL only
  bf16* grad;            // [chunk, ld] bf16: ∂loss/∂logits
  int64_t ld;
  const int32_t* idx;  // the chunk's positions: original row, or −1
  const int32_t* labels;
  float* loss;
  float* p_label;
  int32_t* argmax;
  int64_t V;
  int ctas;  // CTAs per row (the cluster size)
};

// One logits row (chunk position blockIdx.x / ctas) per cluster of `ctas` CTAs, CTA `rank` owning a slice of
// float4 columns. Pass 1 builds the slice's statistics; every CTA merges the cluster's partials in rank
// order; pass 2 re-reads the slice (from L2) and writes ∂loss/∂logits as bf16: softmax − onehot(label) for
// CE, p_draft − p_target for KL. An active row whose label lies outside [0, V) gets NaN loss and p_label
// (the device cannot raise an error without a sync; the CPU backend rejects such a label).
template <bool KL>
__global__ void __launch_bounds__(kRowMaxThreads) lm_loss_row_kernel(RowArgs a) {
  constexpr int U = kUnroll<KL>;
  __shared__ RowStat red_d[32];
  __shared__ TgtStat red_t[32];
  __shared__ RowStat part_d;
  __shared__ TgtStat part_t;
  __shared__ float fin[4];  // draft max, log Σ; target max, log Σ
  const int rank = int(blockIdx.x % unsigned(a.ctas));
  const int64_t i = blockIdx.x / unsigned(a.ctas);
  const int32_t r = a.idx[i];
  if (r < 0) return;  // a dead position: every CTA of the cluster leaves before any barrier
  const int64_t V = a.V;
  int64_t q0, q1;
  slice_of(V, rank, a.ctas, q0, q1);
  const float4* z4 = reinterpret_cast<const float4*>(a.logits + i * a.ld);
  const float4* y4 = KL ? reinterpret_cast<const float4*>(a.tlogits + i * a.ld) : nullptr;

  RowStat sd{-INFINITY, 0.0f, INT_MAX};
  TgtStat st{-INFINITY, 0.0f, 0.0f};
  slice_for_each<U, KL>(z4, y4, q0, q1, false,
                        [&](int64_t qu, bool live, const float(&zv)[4], const float(&yv)[4]) {
    if (!live) return;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = 4 * qu + j;
      if (t < V) {
        row_stat_add(sd, zv[j], int32_t(t));
        if constexpr (KL) tgt_stat_add(st, yv[j], zv[j]);
      }
    }
  });
  sd = stat_block_reduce(sd, red_d);
  if constexpr (KL) st = stat_block_reduce(st, red_t);
  if (threadIdx.x == 0) {
    part_d = sd;
    if constexpr (KL) part_t = st;
  }
  row_sync(a.ctas);
  if (threadIdx.x == 0) {
    RowStat d = *row_partial(&part_d, 0, a.ctas);
    TgtStat g = KL ? *row_partial(&part_t, 0, a.ctas) : TgtStat{};
    for (int k = 1; k < a.ctas; ++k) {
      d = stat_merge(d, *row_partial(&part_d, k, a.ctas));
      if constexpr (KL) g = stat_merge(g, *row_partial(&part_t, k, a.ctas));
    }
    const float log_d = __logf(d.s), log_t = KL ? __logf(g.s) : 0.0f;
    fin[0] = d.m;
    fin[1] = log_d;
    fin[2] = g.m;
    fin[3] = log_t;
    if (rank == 0) {
      const int32_t lab = a.labels[r];
      const bool ok = lab >= 0 && lab < V;
      const float nan = __int_as_float(0x7fc00000), zl = ok ? a.logits[i * a.ld + lab] : 0.0f;
      // KL = E_pt[y − z] − (y_max − z_max) + (log Σ_d − log Σ_t): every term is bounded by the logit range.
      const float loss = KL ? g.a / g.s - (g.m - d.m) + (log_d - log_t) : (d.m - zl) + log_d;
      a.loss[r] = ok ? loss : nan;
      a.p_label[r] = ok ? __expf((zl - d.m) - log_d) : nan;
      a.argmax[r] = d.am;
    }
  }
  row_sync(a.ctas);  // no CTA leaves (or reuses its partial) before the others have read it; fin is visible

  const int32_t lab = a.labels[r];
  const float mz = fin[0], lz = fin[1], my = fin[2], ly = fin[3];
  uint2* g4 = reinterpret_cast<uint2*>(a.grad + i * a.ld);
  slice_for_each<U, KL>(z4, y4, q0, q1, true,
                        [&](int64_t qu, bool live, const float(&zv)[4], const float(&yv)[4]) {
    if (!live) return;
    float gv[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = 4 * qu + j;
      const float p = __expf((zv[j] - mz) - lz);
      if constexpr (KL)
        gv[j] = p - __expf((yv[j] - my) - ly);
      else
        gv[j] = t == lab ? p - 1.0f : p;
      if (t >= V) gv[j] = 0.0f;  // row padding up to ld: never read by the GEMM, kept defined
    }
    const __nv_bfloat162 lo = __floats2bfloat162_rn(gv[0], gv[1]), hi = __floats2bfloat162_rn(gv[2], gv[3]);
    g4[qu] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  });
}

// ---- launchers ----

namespace {

template <bool KL>
void row_kernel_launch(const RowArgs& args, int64_t n, cudaStream_t stream) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = row_config(args.ctas, n, 0, stream, &attr);
  DF_CUDA_CHECK(cudaLaunchKernelEx(&cfg, lm_loss_row_kernel<KL>, args));
}

}  // namespace

void row_copy_launch(const bf16* src, int64_t ld_src, bf16* dst, int64_t ld_dst, const int32_t* idx,
                     int64_t n, int64_t H, bool scatter, cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = H % 8 == 0 && ld_src % 8 == 0 && ld_dst % 8 == 0 && aligned16(src) && aligned16(dst);
  if (vec)
    lm_loss_rows_kernel<8>
        <<<unsigned(n), kCopyThreads, 0, stream>>>(src, ld_src, dst, ld_dst, idx, H, scatter);
  else
    lm_loss_rows_kernel<1>
        <<<unsigned(n), kCopyThreads, 0, stream>>>(src, ld_src, dst, ld_dst, idx, H, scatter);
  DF_CUDA_CHECK_LAUNCH("lm_loss_rows_kernel");
}

void lm_head_loss_launch(GemmContext* gemm, const bf16* hidden, int64_t ld_hidden, const bf16* lm_head,
                         int64_t ld_lm_head, const int32_t* labels, const uint8_t* active,
                         const bf16* target_hidden, int64_t ld_target, bool kl, float* loss, float* p_label,
                         int32_t* argmax, bf16* dhidden, int64_t ld_dhidden, int64_t rows, int64_t H,
                         int64_t V, int64_t chunk_rows, int64_t max_active, void* ws, size_t ws_bytes,
                         cudaStream_t stream) {
  DF_CHECK(
      rows >= 0 && rows <= INT_MAX && H >= 1 && V >= 1 && V <= INT_MAX && chunk_rows >= 1,
      "lm_head_loss_launch: rows %lld, H %lld, V %lld, chunk_rows %lld out of range (rows and V fit int32, "
      "H, V, chunk ≥ 1)",
      (long long)rows, (long long)H, (long long)V, (long long)chunk_rows);
  DF_CHECK(
      ld_hidden >= H && ld_lm_head >= H && ld_dhidden >= H && (!kl || ld_target >= H),
      "lm_head_loss_launch: a row stride is shorter than H %lld (hidden %lld, lm_head %lld, dhidden %lld, "
      "target %lld)",
      (long long)H, (long long)ld_hidden, (long long)ld_lm_head, (long long)ld_dhidden, (long long)ld_target);
  DF_CHECK(gemm && hidden && lm_head && labels && active && loss && p_label && argmax && dhidden &&
               (!kl || target_hidden),
           "lm_head_loss_launch: null pointer argument%s", kl ? " (the KL needs target_hidden)" : "");
  if (rows == 0) return;
  const LmLossLayout L = lm_head_loss_layout(rows, H, V, chunk_rows, kl);
  DF_CHECK(
      ws && ws_bytes >= L.bytes && reinterpret_cast<uintptr_t>(ws) % 256 == 0,
      "lm_head_loss_launch: workspace %p of %zu bytes, needs %zu bytes 256-byte aligned for rows %lld H %lld "
      "V %lld chunk %lld%s (HINT: size it with lm_head_loss_workspace_bytes and the same arguments)",
      ws, ws_bytes, L.bytes, (long long)rows, (long long)H, (long long)V, (long long)chunk_rows,
      kl ? " kl" : "");
  char* base = static_cast<char*>(ws);
  int32_t* idx = reinterpret_cast<int32_t*>(base + L.idx);
  bf16* hid = reinterpret_cast<bf16*>(base + L.hid);
  bf16* tgt = kl ? reinterpret_cast<bf16*>(base + L.tgt) : nullptr;
  float* logits = reinterpret_cast<float*>(base + L.logits);
  float* tlogits = kl ? reinterpret_cast<float*>(base + L.tlogits) : nullptr;
  bf16* grad = reinterpret_cast<bf16*>(base + L.grad);

  lm_loss_compact_kernel<<<1, kScanThreads, 0, stream>>>(active, int(rows), idx);
  DF_CUDA_CHECK_LAUNCH("lm_loss_compact_kernel");
  lm_loss_clear_kernel<<<unsigned(rows), kCopyThreads, 0, stream>>>(active, loss, p_label, argmax, dhidden,
                                                                    ld_dhidden, H);
  DF_CUDA_CHECK_LAUNCH("lm_loss_clear_kernel");
  // The active rows come first in idx. Without max_active the host does not know how many there are (that
  // would take a sync), so it walks every position and the row kernel and the scatter skip the dead ones;
  // with it the GEMMs stop at the last active row (the anchor rows alone are 1/16 of a drafter's rows).
  const int ctas = kl ? row_cluster_size(lm_loss_row_kernel<true>, V, 0)
                      : row_cluster_size(lm_loss_row_kernel<false>, V, 0);
  const RowArgs base_args{logits, tlogits, grad, L.ldv, idx, labels, loss, p_label, argmax, V, ctas};
  const int64_t walk = max_active >= 0 ? std::min(rows, max_active) : rows;
  for (int64_t p0 = 0; p0 < walk; p0 += L.chunk) {
    const int64_t n = std::min(L.chunk, walk - p0);
    RowArgs args = base_args;
    args.idx = idx + p0;
    row_copy_launch(hidden, ld_hidden, hid, L.ldh, args.idx, n, H, false, stream);
    gemm_launch_ex(gemm, hid, L.ldh, false, lm_head, ld_lm_head, true, logits, L.ldv, true, n, V, H, 1.0f,
                   0.0f, stream);
    if (kl) {
      row_copy_launch(target_hidden, ld_target, tgt, L.ldh, args.idx, n, H, false, stream);
      gemm_launch_ex(gemm, tgt, L.ldh, false, lm_head, ld_lm_head, true, tlogits, L.ldv, true, n, V, H, 1.0f,
                     0.0f, stream);
      row_kernel_launch<true>(args, n, stream);
    } else {
      row_kernel_launch<false>(args, n, stream);
    }
    // dhidden of the chunk = grad [n, V] · lm_head [V, H], into the gathered rows' buffer, then scattered.
    gemm_launch_ex(gemm, grad, L.ldv, false, lm_head, ld_lm_head, false, hid, L.ldh, false, n, H, V, 1.0f,
                   0.0f, stream);
    row_copy_launch(hid, L.ldh, dhidden, ld_dhidden, args.idx, n, H, true, stream);
  }
}

}  // namespace df
