// DSpark's head on the device (train_ops.h dspark_head_loss and dspark_head_propose; ops/dspark_head.h is the
// math, ops/cpu/cpu_dspark.cpp the oracle). Every product goes through the one cuBLASLt entry point
// (gemm.cuh): the Markov head's projections (dspark_markov.cu), the logits and their backward. The kernels
// here are the confidence head's dot products, the row kernel of the loss, the gathering of the input
// gradients and W1's scatter.
//
// The loss: draft logits d = z·lm_headᵀ + u·W2ᵀ and target logits t = h_T·lm_headᵀ are made a chunk of rows
// at a time (never [N, V] at once), t once per distinct target row of the chunk (dspark_target_plan: the
// blocks of neighbouring anchors share most of their target rows). The L1 term ‖softmax(d) − softmax(t)‖₁
// needs both full softmaxes, and its gradient q_v·(sign_v − Σ sign·q) needs a second full-row sum, so the
// row kernel walks each row three times from the f32 logits: pass 1 the max, Σ exp and argmax of both rows
// (the CE row statistics of row_stat.cuh), pass 2 Σ|q − t| and Σ sign(q − t)·q, pass 3 the bf16 gradient
// α_ce·w·(q − onehot) + α_l1·w·q·(sign − Σ sign·q). dz = gd·lm_head and du = gd·W2 are then GEMMs over the
// vocabulary, as in DFlash's loss. The confidence head is a dot product per row; its BCE target 1 − L1/2 is
// known after the chunks, so its loss and gradient come last. W1's gradient is a scatter by previous token
// (token_scatter.cu): the keys (token, row) are sorted and each token's rows summed in row order, so the
// result is the same bits every run.
// Everything is queued on one stream with no device sync and no allocation; the target plan is copied from
// the host's pageable memory (the copy has read it when the call returns).
#include <algorithm>
#include <climits>

#include "kernels/gemm/gemm.cuh"
#include "kernels/launchers.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/train/dspark_head.cuh"
#include "kernels/train/dspark_markov.cuh"
#include "kernels/train/head_launch.cuh"
#include "kernels/train/row_argmax.cuh"
#include "kernels/train/row_stat.cuh"
#include "kernels/train_launchers.cuh"

namespace df {

using namespace head_launch;

// ---- kernels ----

// The confidence logit of row r: conf_w·[y_r ; W1[prev[r]] if markov] + conf_b, one CTA per row in a fixed
// order.
__global__ void dspark_conf_fwd_kernel(const bf16* y, int64_t ld_y, const bf16* w1, const int32_t* prev,
                                       int V, const bf16* cw, const float* cb, int H, int R, bool markov,
                                       float* conf) {
  const int64_t r = blockIdx.x;
  float s = 0.0f;
  for (int c = threadIdx.x; c < H; c += blockDim.x)
    s += __bfloat162float(y[r * ld_y + c]) * __bfloat162float(cw[c]);
  if (markov)
    for (int c = threadIdx.x; c < R; c += blockDim.x)
      s += __bfloat162float(w1_at(w1, prev[r], V, R, c)) * __bfloat162float(cw[H + c]);
  s = block_sum(s);
  if (threadIdx.x == 0) conf[r] = s + cb[0];
}

struct DSparkRowArgs {
  const float* dl;      // [chunk, ld] f32 draft logits
  const float* tl;      // [chunk, ld] f32 target logits of the chunk's distinct target rows, or null
  const int32_t* tidx;  // [N] row r's target logits row in tl
  bf16* gd;             // [chunk, ld] bf16 ∂/∂draft logits
  int64_t ld;
  int64_t row0;  // the chunk's first row
  const int32_t* labels;
  const float* row_w;
  int32_t* argmax;
  float* l1;          // [N] each row's L1 (0 without a target or weight)
  HeadStatRows stat;  // slot k at block offset k + 1 (its label is x[a+k+1])
  int64_t V;
  float a_ce, a_l1;
  bool backward;
};

// The four floats at q of a logits row, or zeros for a null row (no target distribution): through L2 while
// the row is read again, streamed on its last read.
__device__ __forceinline__ void row4(const float4* row, int64_t q, float (&v)[4], bool last) {
  const float4 z = row ? (last ? __ldcs(row + q) : __ldcg(row + q)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  v[0] = z.x;
  v[1] = z.y;
  v[2] = z.z;
  v[3] = z.w;
}

// One row (chunk position blockIdx.x) per CTA, three passes (see the top of the file). A row without weight
// gets argmax −1, loss 0 and zero gradients. An active row whose label lies outside [0, V) gets NaN loss (the
// device cannot raise an error without a sync; the CPU backend rejects such a label).
__global__ void __launch_bounds__(kRowThreads) dspark_row_kernel(DSparkRowArgs a) {
  __shared__ RowStat red_d[32], red_t[32];
  __shared__ float fin_s[4];  // draft max, log Σ; target max, log Σ
  const int64_t i = blockIdx.x, r = a.row0 + i;
  const float w = a.row_w[r];
  const int32_t lab = a.labels[r];
  const int64_t V = a.V, V4 = (V + 3) / 4, L4 = a.ld / 4;
  const bool target = a.tl != nullptr;
  const float4* d4 = reinterpret_cast<const float4*>(a.dl + i * a.ld);
  const float4* t4 = target ? reinterpret_cast<const float4*>(a.tl + a.tidx[r] * a.ld) : nullptr;
  uint2* g4 = reinterpret_cast<uint2*>(a.gd + i * a.ld);
  if (w == 0.0f) {
    if (threadIdx.x == 0) {
      a.argmax[r] = -1;
      a.l1[r] = 0.0f;
      a.stat.put(r, 0.0f, 0.0f, lab, -1);
    }
    if (a.backward)
      for (int64_t q = threadIdx.x; q < L4; q += blockDim.x) g4[q] = make_uint2(0u, 0u);
    return;
  }
  // Pass 1: both rows' max, Σ exp and the draft argmax.
  RowStat sd{-INFINITY, 0.0f, INT_MAX}, st{-INFINITY, 0.0f, INT_MAX};
  for (int64_t q = threadIdx.x; q < V4; q += blockDim.x) {
    float vd[4], vt[4];
    row4(d4, q, vd, false);
    row4(t4, q, vt, false);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t t = 4 * q + c;
      if (t < V) {
        row_stat_add(sd, vd[c], int32_t(t));
        if (target) row_stat_add(st, vt[c], int32_t(t));
      }
    }
  }
  sd = stat_block_reduce(sd, red_d);
  if (target) st = stat_block_reduce(st, red_t);
  if (threadIdx.x == 0) {
    fin_s[0] = sd.m;
    fin_s[1] = __logf(sd.s);
    fin_s[2] = st.m;
    fin_s[3] = target ? __logf(st.s) : 0.0f;
  }
  __syncthreads();
  const float md = fin_s[0], ld = fin_s[1], mt = fin_s[2], lt = fin_s[3];
  // Pass 2: L1 = Σ|q − t| and Σ sign(q − t)·q.
  float l1 = 0.0f, sq = 0.0f;
  if (target) {
    float pl = 0.0f, ps = 0.0f;
    for (int64_t q = threadIdx.x; q < V4; q += blockDim.x) {
      float vd[4], vt[4];
      row4(d4, q, vd, false);
      row4(t4, q, vt, false);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (4 * q + c >= V) break;
        const float pq = __expf((vd[c] - md) - ld), pt = __expf((vt[c] - mt) - lt), diff = pq - pt;
        pl += fabsf(diff);
        ps += diff > 0.0f ? pq : (diff < 0.0f ? -pq : 0.0f);
      }
    }
    l1 = block_sum(pl);
    sq = block_sum(ps);
  }
  if (threadIdx.x == 0) {
    const bool ok = lab >= 0 && lab < V;
    const float ce = ok ? (md - a.dl[i * a.ld + lab]) + ld : __int_as_float(0x7fc00000);
    a.argmax[r] = sd.am;
    a.l1[r] = l1;
    a.stat.put(r, a.a_ce * ce + (a.a_l1 > 0.0f ? a.a_l1 * l1 : 0.0f), w, lab, sd.am);
  }
  if (!a.backward) return;
  // Pass 3: the gradient of α_ce·w·CE + α_l1·w·L1 with respect to the draft logits.
  const float cce = a.a_ce * w, cl1 = target ? a.a_l1 * w : 0.0f;
  for (int64_t q = threadIdx.x; q < L4; q += blockDim.x) {
    float g[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (q < V4) {
      float vd[4], vt[4];
      row4(d4, q, vd, true);
      row4(t4, q, vt, true);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t t = 4 * q + c;
        if (t >= V) break;
        const float pq = __expf((vd[c] - md) - ld);
        g[c] = cce * (pq - (t == lab ? 1.0f : 0.0f));
        if (cl1 != 0.0f) {
          const float diff = pq - __expf((vt[c] - mt) - lt);
          g[c] += cl1 * pq * ((diff > 0.0f ? 1.0f : (diff < 0.0f ? -1.0f : 0.0f)) - sq);
        }
      }
    }
    const __nv_bfloat162 b0 = __floats2bfloat162_rn(g[0], g[1]), b1 = __floats2bfloat162_rn(g[2], g[3]);
    g4[q] = make_uint2(*reinterpret_cast<const uint32_t*>(&b0), *reinterpret_cast<const uint32_t*>(&b1));
  }
}

// The confidence head's loss per row (one thread a row): BCE with logits against acc = clamp(1 − L1/2, 0, 1)
// (overflow-free, as torch), α_conf·BCE added to the row's statistics loss, and dconf = α_conf·w·(σ(c) − acc)
// (0 for a weightless row).
__global__ void dspark_conf_loss_kernel(const float* conf, const float* l1, const float* row_w, int64_t N,
                                        float a_conf, HeadStatRows stat, float* dconf) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= N) return;
  const float w = row_w[r];
  if (w == 0.0f) {
    dconf[r] = 0.0f;
    return;
  }
  const float c = conf[r], acc = fminf(fmaxf(1.0f - 0.5f * l1[r], 0.0f), 1.0f);
  stat.loss[stat.row_of(r)] += a_conf * (fmaxf(c, 0.0f) - c * acc + log1pf(expf(-fabsf(c))));
  dconf[r] = a_conf * w * (sigmoid_f(c) - acc);
}

// Row r's input gradients gathered (one CTA a row): dy = dz + din's z columns + dconf·conf_w[:H] in bf16;
// de = de_base + din's e columns + dconf·conf_w[H:] (markov confidence) when de is set. Null parts are
// absent.
__global__ void dspark_combine_kernel(const float* dz, int H, const float* din, int64_t ld_din, int z_col,
                                      int e_col, const float* de_base, const float* dconf, const bf16* cw,
                                      bool conf_markov, int R, bf16* dy, int64_t ld_dy, float* de) {
  const int64_t r = blockIdx.x;
  const float dc = dconf ? dconf[r] : 0.0f;
  for (int c = threadIdx.x; c < H; c += blockDim.x) {
    float v = dz[r * H + c];
    if (din) v += din[r * ld_din + z_col + c];
    if (dc != 0.0f) v += dc * __bfloat162float(cw[c]);
    dy[r * ld_dy + c] = __float2bfloat16(v);
  }
  if (!de) return;
  for (int c = threadIdx.x; c < R; c += blockDim.x) {
    float v = de_base ? de_base[r * R + c] : 0.0f;
    if (din) v += din[r * ld_din + e_col + c];
    if (dc != 0.0f && conf_markov) v += dc * __bfloat162float(cw[H + c]);
    de[r * R + c] = v;
  }
}

// The confidence head's weight gradient, first pass: part[k·C + c] = Σ dconf[r]·in[r, c] over chunk k's rows
// [k·per, (k + 1)·per) in row order, with in = [y ; W1[prev] if markov] (one thread a column of one chunk);
// column_sum_launch adds the chunks in order.
__global__ void dspark_conf_dw_partial_kernel(const float* dconf, const bf16* y, int64_t ld_y, const bf16* w1,
                                              const int32_t* prev, int V, int64_t N, int H, int R, bool markov,
                                              int64_t per, float* part) {
  const int C = H + (markov ? R : 0), c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t r0 = blockIdx.y * per, r1 = min(N, r0 + per);
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float d = dconf[r];
    if (d == 0.0f) continue;
    s += d * __bfloat162float(c < H ? y[r * ld_y + c] : w1_at(w1, prev[r], V, R, c - H));
  }
  part[int64_t(blockIdx.y) * C + c] = s;
}

// keys[i] = (prev[i] as u32) << 32 | i for the N rows, all ones for the padding up to n.
__global__ void dspark_sort_keys_kernel(const int32_t* prev, int64_t N, int64_t n, uint64_t* keys) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  keys[i] = i < N ? (uint64_t(uint32_t(prev[i])) << 32) | uint64_t(i) : ~uint64_t(0);
}

// ---- launchers ----

namespace {

void check_shape(const char* op, const DSparkHeadShape& d) {
  const bool markov = d.markov != DSparkMarkov::none;
  DF_CHECK(d.nb >= 0 && d.B >= 2 && d.H >= 1 && d.V >= 1 && d.V <= INT_MAX && d.nb * d.B <= INT_MAX &&
               (markov ? d.R >= 1 : d.R == 0) && (!d.confidence_markov || markov),
           "%s: bad head shape nb %lld B %d H %d V %d markov_rank %d (Markov head %d, confidence %d, with "
           "markov %d)",
           op, (long long)d.nb, d.B, d.H, d.V, d.R, int(d.markov), int(d.confidence),
           int(d.confidence_markov));
}

}  // namespace

void dspark_head_loss_launch(GemmContext* gemm, const DSparkHeadShape& d, const bf16* y, int64_t ld_y,
                             const bf16* lm_head, const bf16* target, int64_t ld_target, int64_t target_count,
                             const int32_t* target_rows, const DSparkHeadWeightPtrs& w, const int32_t* labels,
                             const int32_t* prev, const float* row_w, const DSparkLossWeights& alpha,
                             bool backward, float beta_dw, int32_t* argmax, bf16* dy, int64_t ld_dy,
                             const DSparkHeadGradPtrs& dw, double* stats, int64_t chunk_rows, void* ws,
                             size_t ws_bytes, cudaStream_t stream) {
  const char* op = "dspark_head_loss_launch";
  check_shape(op, d);
  const int64_t N = d.nb * d.B;
  const int B = d.B, H = d.H, R = d.R, C = d.confidence_in();
  const bool markov = d.markov != DSparkMarkov::none;
  const bool conf_loss = d.confidence && alpha.confidence > 0.0f;
  // ops/dspark_head.h dspark_needs_target_hidden: the L1 term and the confidence head's target.
  const bool need_target = alpha.l1 > 0.0f || conf_loss;
  DF_CHECK(ld_y >= H && (!target || ld_target >= H) && (!backward || ld_dy >= H) && chunk_rows >= 1,
           "%s: a row stride is shorter than H %d (y %lld, target %lld, dy %lld), or chunk_rows %lld < 1", op,
           H, (long long)ld_y, (long long)ld_target, (long long)ld_dy, (long long)chunk_rows);
  DF_CHECK(gemm && y && lm_head && labels && prev && row_w && argmax && stats &&
               (!markov || (w.markov_w1 && w.markov_w2)) &&
               (d.markov != DSparkMarkov::gated || (w.gate_w && w.gate_b)) &&
               (d.markov != DSparkMarkov::rnn || (w.joint_w && w.joint_b)) &&
               (!d.confidence || (w.conf_w && w.conf_b)) && (!need_target || (target && target_rows)) &&
               (!backward || (dy && (!markov || (dw.markov_w1 && dw.markov_w2)) &&
                              (d.markov != DSparkMarkov::gated || (dw.gate_w && dw.gate_b)) &&
                              (d.markov != DSparkMarkov::rnn || (dw.joint_w && dw.joint_b)) &&
                              (!d.confidence || (dw.conf_w && dw.conf_b)))),
           "%s: null pointer argument (a weight, gradient, target_hidden or target_rows the head or the loss "
           "needs)",
           op);
  if (need_target)
    for (int64_t r = 0; r < N; ++r)
      DF_CHECK(target_rows[r] >= 0 && target_rows[r] < target_count,
               "%s: target_rows[%lld] = %d is not a row of target_hidden (%lld rows)", op, (long long)r,
               target_rows[r], (long long)target_count);
  // The CPU backend zeroes the gradients for beta 0 and adds for any other beta.
  const float beta = beta_dw == 0.0f ? 0.0f : 1.0f;
  if (backward && beta == 0.0f) {  // every gradient is written below by adding, or the range is empty
    if (markov) zero(dw.markov_w1, size_t(int64_t(d.V) * R) * 4, stream);
    if (d.confidence) {
      zero(dw.conf_w, size_t(C) * 4, stream);
      zero(dw.conf_b, 4, stream);
    }
    if (N == 0) {
      if (markov) zero(dw.markov_w2, size_t(int64_t(d.V) * R) * 4, stream);
      if (d.markov == DSparkMarkov::gated) {
        zero(dw.gate_w, size_t(int64_t(R) * d.cat_width()) * 4, stream);
        zero(dw.gate_b, size_t(R) * 4, stream);
      }
      if (d.markov == DSparkMarkov::rnn) {
        zero(dw.joint_w, size_t(int64_t(3 * R) * d.cat_width()) * 4, stream);
        zero(dw.joint_b, size_t(3 * R) * 4, stream);
      }
    }
  }
  if (N == 0) return;
  const DSparkLayout L = dspark_head_layout(d, chunk_rows);
  check_ws(op, ws, ws_bytes, L.bytes);

  // ---- forward: the Markov head's u and the confidence logits ----
  if (markov) dspark_markov_fwd(gemm, d, L, y, ld_y, w, prev, ws, stream);
  float* conf = at<float>(ws, L.conf);
  if (d.confidence) {
    dspark_conf_fwd_kernel<<<unsigned(N), kThreads, 0, stream>>>(y, ld_y, w.markov_w1, prev, d.V, w.conf_w,
                                                                 w.conf_b, H, R, d.confidence_markov, conf);
    DF_CUDA_CHECK_LAUNCH("dspark_conf_fwd_kernel");
  }

  // ---- the logits a chunk at a time: CE and L1, the row gradients, what flows back through the vocab ----
  // The chunks' distinct target rows and each row's index among them, computed here and copied from pageable
  // memory (the copy has read them when it returns).
  DSparkTargetPlan plan;
  int32_t* tidx = at<int32_t>(ws, L.tidx);
  int32_t* tlist = at<int32_t>(ws, L.tlist);
  bf16* tg = at<bf16>(ws, L.tg);
  if (need_target) {
    plan = dspark_target_plan(target_rows, N, L.chunk);
    DF_CUDA_CHECK(cudaMemcpyAsync(tidx, plan.local.data(), size_t(N) * 4, cudaMemcpyHostToDevice, stream));
    DF_CUDA_CHECK(
        cudaMemcpyAsync(tlist, plan.list.data(), plan.list.size() * 4, cudaMemcpyHostToDevice, stream));
  }
  const bf16* u = markov ? at<bf16>(ws, L.u) : nullptr;
  float* dl = at<float>(ws, L.dl);
  float* tl = at<float>(ws, L.tl);
  bf16* gd = at<bf16>(ws, L.gd);
  float* dz = at<float>(ws, L.dz);
  float* du = markov ? at<float>(ws, L.du) : nullptr;
  float* l1 = at<float>(ws, L.l1);
  DSparkRowArgs ra;
  ra.dl = dl;
  ra.tl = need_target ? tl : nullptr;
  ra.tidx = tidx;
  ra.gd = gd;
  ra.ld = L.ldv;
  ra.labels = labels;
  ra.row_w = row_w;
  ra.argmax = argmax;
  ra.l1 = l1;
  ra.stat = head_stat_rows(ws, L.stat, B, 1);
  ra.V = d.V;
  ra.a_ce = alpha.ce;
  ra.a_l1 = alpha.l1;
  ra.backward = backward;
  for (int64_t p0 = 0; p0 < N; p0 += L.chunk) {
    const int64_t n = std::min(L.chunk, N - p0);
    gemm_launch_ex(gemm, y + p0 * ld_y, ld_y, false, lm_head, H, true, dl, L.ldv, true, n, d.V, H, 1.0f, 0.0f,
                   stream);
    if (markov)
      gemm_launch_ex(gemm, u + p0 * L.ldr, L.ldr, false, w.markov_w2, R, true, dl, L.ldv, true, n, d.V, R,
                     1.0f, 1.0f, stream);
    if (need_target) {
      const int64_t c = p0 / L.chunk, t0 = plan.start[size_t(c)], nt = plan.start[size_t(c) + 1] - t0;
      embedding_launch(tlist + t0, target, ld_target, tg, L.ldh, nt, H, stream);
      gemm_launch_ex(gemm, tg, L.ldh, false, lm_head, H, true, tl, L.ldv, true, nt, d.V, H, 1.0f, 0.0f,
                     stream);
    }
    ra.row0 = p0;
    dspark_row_kernel<<<unsigned(n), kRowThreads, 0, stream>>>(ra);
    DF_CUDA_CHECK_LAUNCH("dspark_row_kernel");
    if (!backward) continue;
    gemm_launch_ex(gemm, gd, L.ldv, false, lm_head, H, false, dz + p0 * H, H, true, n, H, d.V, 1.0f, 0.0f,
                   stream);
    if (!markov) continue;
    gemm_launch_ex(gemm, gd, L.ldv, false, w.markov_w2, R, false, du + p0 * R, R, true, n, R, d.V, 1.0f, 0.0f,
                   stream);
    gemm_launch_ex(gemm, gd, L.ldv, true, u + p0 * L.ldr, L.ldr, false, dw.markov_w2, R, true, d.V, R, n,
                   1.0f, p0 == 0 ? beta : 1.0f, stream);
  }
  float* dconf = d.confidence ? at<float>(ws, L.dconf) : nullptr;
  if (conf_loss) {
    dspark_conf_loss_kernel<<<grid_of(N), kThreads, 0, stream>>>(conf, l1, row_w, N, alpha.confidence,
                                                                 ra.stat, dconf);
    DF_CUDA_CHECK_LAUNCH("dspark_conf_loss_kernel");
  } else if (dconf) {
    zero(dconf, size_t(N) * 4, stream);
  }
  head_stats_launch(ra.stat, d.nb, stats, stream);
  if (!backward) return;

  // ---- backward: the Markov head, then every input gradient gathered, then W1 and the confidence head ----
  float* din = nullptr;
  const float* de_base = nullptr;
  float* de = markov ? at<float>(ws, L.de) : nullptr;
  if (d.markov == DSparkMarkov::vanilla) {
    de_base = du;
  } else if (markov) {
    dspark_markov_bwd(gemm, d, L, w, dw, beta, ws, stream);
    din = at<float>(ws, L.din);
    if (d.markov == DSparkMarkov::gated) de_base = de;  // ∂e = du·g, written by markov_bwd
  }
  dspark_combine_kernel<<<unsigned(N), kThreads, 0, stream>>>(dz, H, din, L.ldc, d.z_col(), d.e_col(),
                                                              de_base, dconf, w.conf_w, d.confidence_markov,
                                                              R, dy, ld_dy, de);
  DF_CUDA_CHECK_LAUNCH("dspark_combine_kernel");
  if (markov) {
    uint64_t* keys = at<uint64_t>(ws, L.keys);
    const int64_t n = L.n_sort;
    dspark_sort_keys_kernel<<<grid_of(n), kThreads, 0, stream>>>(prev, N, n, keys);
    DF_CUDA_CHECK_LAUNCH("dspark_sort_keys_kernel");
    token_sort_launch(keys, n, stream);
    token_row_sum_launch(keys, N, d.V, nullptr, de, 1, R, dw.markov_w1, stream);
  }
  if (d.confidence) {
    float* part = at<float>(ws, L.part);
    const int64_t chunks = column_partial_chunks(N, C), per = (N + chunks - 1) / chunks;
    dspark_conf_dw_partial_kernel<<<dim3(grid_of(C), unsigned(chunks)), kThreads, 0, stream>>>(
        dconf, y, ld_y, w.markov_w1, prev, d.V, N, H, R, d.confidence_markov, per, part);
    DF_CUDA_CHECK_LAUNCH("dspark_conf_dw_partial_kernel");
    column_sum_launch(part, chunks, C, dw.conf_w, 1.0f, stream);
    dspark_colsum_launch(dconf, 1, N, 1, dw.conf_b, 1.0f, part, stream);
  }
}

const int32_t* dspark_head_propose_launch(GemmContext* gemm, const DSparkHeadShape& d, const bf16* y,
                                          int64_t ld_y, const bf16* lm_head, const DSparkHeadWeightPtrs& w,
                                          int32_t first, float** confidence, void* ws, size_t ws_bytes,
                                          cudaStream_t stream) {
  const char* op = "dspark_head_propose_launch";
  check_shape(op, d);
  DF_CHECK(d.nb == 1 && ld_y >= d.H && first >= 0 && first < d.V,
           "%s: one block (nb %lld), y stride %lld ≥ H %d, first token %d in [0, %d)", op, (long long)d.nb,
           (long long)ld_y, d.H, first, d.V);
  const bool markov = d.markov != DSparkMarkov::none;
  DF_CHECK(gemm && y && lm_head && (!markov || (w.markov_w1 && w.markov_w2)) &&
               (d.markov != DSparkMarkov::gated || (w.gate_w && w.gate_b)) &&
               (d.markov != DSparkMarkov::rnn || (w.joint_w && w.joint_b)) &&
               (!d.confidence || (w.conf_w && w.conf_b)),
           "%s: null pointer argument", op);
  const int B = d.B, H = d.H, R = d.R;
  const DSparkProposeLayout L = dspark_propose_layout(d);
  check_ws(op, ws, ws_bytes, L.bytes);
  float* base = at<float>(ws, L.base);
  float* fin = at<float>(ws, L.fin);
  const bf16* u = at<bf16>(ws, L.u);
  int32_t* tok = at<int32_t>(ws, L.tok);
  float* conf = at<float>(ws, L.conf);
  gemm_launch_ex(gemm, y, ld_y, false, lm_head, H, true, base, L.ldv, true, B, d.V, H, 1.0f, 0.0f, stream);
  // From pageable memory: the copy has read `first` when it returns.
  DF_CUDA_CHECK(cudaMemcpyAsync(tok, &first, sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  for (int k = 0; k + 1 < B; ++k) {
    // Slot k proposes token k + 1 from its hidden state and the previous token k (the drafter's own after
    // the first).
    const bf16* yk = y + int64_t(k) * ld_y;
    const float* logits = base + int64_t(k) * L.ldv;
    if (markov) {
      dspark_markov_slot(gemm, d, L, yk, w, tok + k, k == 0, ws, stream);
      gemm_launch_addend(gemm, u, L.ldr, false, w.markov_w2, R, true, logits, L.ldv, fin, L.ldv, true, 1, d.V,
                         R, 1.0f, 1.0f, stream);
      logits = fin;
    }
    row_argmax_launch(logits, d.V, tok + k + 1, stream);
    if (d.confidence) {
      dspark_conf_fwd_kernel<<<1, kThreads, 0, stream>>>(yk, ld_y, w.markov_w1, tok + k, d.V, w.conf_w,
                                                         w.conf_b, H, R, d.confidence_markov, conf + k);
      DF_CUDA_CHECK_LAUNCH("dspark_conf_fwd_kernel");
    }
  }
  if (confidence) *confidence = d.confidence ? conf : nullptr;
  return tok;
}

}  // namespace df
