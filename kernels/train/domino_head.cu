// Domino's head on the device (train_ops.h domino_head_loss and domino_head_propose; ops/domino_head.h is the
// math, ops/cpu/cpu_domino.cpp the oracle). Every product goes through the one cuBLASLt entry point
// (gemm.cuh): the GRU's input projection of all block rows at once, its recurrent product once per step for
// all blocks together, the correction MLP, the logits. The kernels here are the gate math, the gathers and
// the row kernel of the two cross-entropies.
//
// The loss: base logits = y·lm_headᵀ and the correction a·proj_outᵀ are made a chunk of rows at a time (the
// vocabulary meets lm_head once, as in DFlash's loss); one row kernel forms final = base + correction as it
// reads them, reduces both rows in the same pass and writes both bf16 gradients,
// ∂/∂final = (1 − λ)·w·(p_final − onehot) and ∂/∂base = ∂/∂final + λ·w·(p_base − onehot), so
// dy = (∂/∂base)·lm_head is one GEMM over the vocabulary, as in DFlash. Every row is multiplied, rows
// without weight included (their gradients are zero); skipping them, as lm_head_loss does, would save only
// the padding blocks with shift_label, where every slot carries a label.
// Everything is queued on one stream: no sync, no allocation.
#include <algorithm>
#include <climits>

#include "kernels/gemm/gemm.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/train/head_launch.cuh"
#include "kernels/train/row_argmax.cuh"
#include "kernels/train/row_stat.cuh"
#include "kernels/train_launchers.cuh"

namespace df {

using namespace head_launch;

// ---- kernels ----

// One GRU step (bias-free, PyTorch gate order r, z, n) of nb sequences: row j of xi (stride ld_xi) holds
// W_i·x, row j of hh (stride 3G) W_h·h_prev, hp [nb, G] the previous state. Writes the state h [nb, G] in f32
// and bf16 (h may be hp: each element is read, then written, by one thread) and, with gates set, r, u, n and
// W_hn·h_prev at gates + {0, 1, 2, 3}·gate_stride (what the backward needs).
__global__ void domino_gru_fwd_kernel(const float* xi, int64_t ld_xi, const float* hh, const float* hp,
                                      float* h, bf16* hb, float* gates, int64_t gate_stride, int64_t nb,
                                      int G) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= nb * G) return;
  const int64_t j = i / G;
  const int g = int(i % G);
  const float* x = xi + j * ld_xi;
  const float* q = hh + j * 3 * G;
  const float r = sigmoid_f(x[g] + q[g]);
  const float u = sigmoid_f(x[G + g] + q[G + g]);
  const float hn = q[2 * G + g];
  const float n = tanhf(x[2 * G + g] + r * hn);
  const float v = (1.0f - u) * n + u * hp[i];
  h[i] = v;
  hb[i] = __float2bfloat16(v);
  if (gates) {
    gates[i] = r;
    gates[gate_stride + i] = u;
    gates[2 * gate_stride + i] = n;
    gates[3 * gate_stride + i] = hn;
  }
}

// Row r = j·B + k of the correction's input [y_r ; h]: h is the GRU state slot k reads, state k − lag + 1 of
// hsb ([B + 1, nb, G], state 0 the zero start), for k ≥ s; zeros before (those slots get no correction).
__global__ void domino_fcat_kernel(const bf16* y, int64_t ld_y, const bf16* hsb, int64_t nb, int B, int H,
                                   int G, int s, int lag, bf16* fcat, int64_t ldf) {
  const int64_t r = blockIdx.x, j = r / B;
  const int k = int(r % B);
  bf16* o = fcat + r * ldf;
  for (int c = threadIdx.x; c < H; c += blockDim.x) o[c] = y[r * ld_y + c];
  const bf16* hs = k >= s ? hsb + (int64_t(k - lag + 1) * nb + j) * G : nullptr;
  for (int c = threadIdx.x; c < G; c += blockDim.x) o[H + c] = hs ? hs[c] : __float2bfloat16(0.0f);
}

// a = silu(m) for rows whose slot k = r mod B is ≥ s, 0 for the others; m, a [rows, E].
__global__ void domino_silu_kernel(const float* m, bf16* a, int64_t rows, int E, int B, int s) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * E) return;
  const bool on = (i / E) % B >= s;
  a[i] = __float2bfloat16(on ? m[i] * sigmoid_f(m[i]) : 0.0f);
}

// dm = da · silu'(m) for the corrected rows, 0 for the others.
__global__ void domino_dsilu_kernel(const float* da, const float* m, bf16* dm, int64_t rows, int E, int B,
                                    int s) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * E) return;
  const bool on = (i / E) % B >= s;
  const float sg = sigmoid_f(m[i]);
  dm[i] = __float2bfloat16(on ? da[i] * sg * (1.0f + m[i] * (1.0f - sg)) : 0.0f);
}

struct DominoRowArgs {
  const float* base;  // [chunk, ld] f32
  const float* corr;  // [chunk, ld] f32: final = base + corr
  bf16* gbase;        // [chunk, ld] bf16: ∂/∂base, the final term's included
  bf16* gfin;         // [chunk, ld] bf16: ∂/∂final
  int64_t ld;
  int64_t row0;  // the chunk's first row
  const int32_t* labels;
  const float* row_w;
  int32_t* argmax;
  HeadStatRows stat;  // slot k at block offset k + shift
  int64_t V;
  float lambda;
  bool backward;
};

// One row (chunk position blockIdx.x) per CTA: pass 1 reduces the base and the final row together, pass 2
// re-reads them and writes both gradients (row padding up to ld as zeros). A row without weight gets
// argmax −1, loss 0 and zero gradients. An active row whose label lies outside [0, V) gets NaN loss (the
// device cannot raise an error without a sync; the CPU backend rejects such a label).
__global__ void __launch_bounds__(kRowThreads) domino_row_kernel(DominoRowArgs a) {
  __shared__ RowStat red_b[32], red_f[32];
  __shared__ float fin_s[4];  // base max, log Σ; final max, log Σ
  const int64_t i = blockIdx.x, r = a.row0 + i;
  const float w = a.row_w[r];
  const int32_t lab = a.labels[r];
  const int64_t V = a.V, V4 = (V + 3) / 4, L4 = a.ld / 4;
  const float4* b4 = reinterpret_cast<const float4*>(a.base + i * a.ld);
  const float4* c4 = reinterpret_cast<const float4*>(a.corr + i * a.ld);
  uint2* gb4 = reinterpret_cast<uint2*>(a.gbase + i * a.ld);
  uint2* gf4 = reinterpret_cast<uint2*>(a.gfin + i * a.ld);
  if (w == 0.0f) {
    if (threadIdx.x == 0) {
      a.argmax[r] = -1;
      a.stat.put(r, 0.0f, 0.0f, lab, -1);
    }
    if (a.backward)
      for (int64_t q = threadIdx.x; q < L4; q += blockDim.x) gb4[q] = gf4[q] = make_uint2(0u, 0u);
    return;
  }
  RowStat sb{-INFINITY, 0.0f, INT_MAX}, sf{-INFINITY, 0.0f, INT_MAX};
  for (int64_t q = threadIdx.x; q < V4; q += blockDim.x) {
    const float4 zb = __ldcg(b4 + q), zc = __ldcg(c4 + q);
    const float vb[4] = {zb.x, zb.y, zb.z, zb.w};
    const float vf[4] = {zb.x + zc.x, zb.y + zc.y, zb.z + zc.z, zb.w + zc.w};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t t = 4 * q + c;
      if (t < V) {
        row_stat_add(sb, vb[c], int32_t(t));
        row_stat_add(sf, vf[c], int32_t(t));
      }
    }
  }
  sb = stat_block_reduce(sb, red_b);
  sf = stat_block_reduce(sf, red_f);
  if (threadIdx.x == 0) {
    const bool ok = lab >= 0 && lab < V;
    const float lb = __logf(sb.s), lf = __logf(sf.s);
    const float zb = ok ? a.base[i * a.ld + lab] : 0.0f, zf = ok ? zb + a.corr[i * a.ld + lab] : 0.0f;
    const float ce_b = (sb.m - zb) + lb, ce_f = (sf.m - zf) + lf;
    a.argmax[r] = sf.am;
    a.stat.put(r, ok ? (1.0f - a.lambda) * ce_f + a.lambda * ce_b : __int_as_float(0x7fc00000), w, lab,
               sf.am);
    fin_s[0] = sb.m;
    fin_s[1] = lb;
    fin_s[2] = sf.m;
    fin_s[3] = lf;
  }
  __syncthreads();
  if (!a.backward) return;
  const float mb = fin_s[0], lb = fin_s[1], mf = fin_s[2], lf = fin_s[3];
  const float cf = (1.0f - a.lambda) * w, cb = a.lambda * w;
  for (int64_t q = threadIdx.x; q < L4; q += blockDim.x) {
    float gb[4] = {0.0f, 0.0f, 0.0f, 0.0f}, gf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (q < V4) {
      const float4 zb = __ldcs(b4 + q), zc = __ldcs(c4 + q);
      const float vb[4] = {zb.x, zb.y, zb.z, zb.w};
      const float vf[4] = {zb.x + zc.x, zb.y + zc.y, zb.z + zc.z, zb.w + zc.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t t = 4 * q + c;
        if (t >= V) break;
        const float oh = t == lab ? 1.0f : 0.0f;
        gf[c] = cf * (__expf((vf[c] - mf) - lf) - oh);
        gb[c] = gf[c] + cb * (__expf((vb[c] - mb) - lb) - oh);
      }
    }
    const __nv_bfloat162 b0 = __floats2bfloat162_rn(gb[0], gb[1]), b1 = __floats2bfloat162_rn(gb[2], gb[3]);
    const __nv_bfloat162 f0 = __floats2bfloat162_rn(gf[0], gf[1]), f1 = __floats2bfloat162_rn(gf[2], gf[3]);
    gb4[q] = make_uint2(*reinterpret_cast<const uint32_t*>(&b0), *reinterpret_cast<const uint32_t*>(&b1));
    gf4[q] = make_uint2(*reinterpret_cast<const uint32_t*>(&f0), *reinterpret_cast<const uint32_t*>(&f1));
  }
}

// Row r = j·B + k of df [N, ldf] f32 (∂/∂[y ; h]): dy[r] = bf16(df[r, :H]); the h part goes to the GRU state
// it came from, dhs [B, nb, G] at step t = k − lag (every step has exactly one such row).
__global__ void domino_dy_kernel(const float* df, int64_t ldf, bf16* dy, int64_t ld_dy, float* dhs,
                                 int64_t nb, int B, int H, int G, int lag) {
  const int64_t r = blockIdx.x, j = r / B;
  const int t = int(r % B) - lag;
  for (int c = threadIdx.x; c < H; c += blockDim.x) dy[r * ld_dy + c] = __float2bfloat16(df[r * ldf + c]);
  if (t < 0) return;
  for (int c = threadIdx.x; c < G; c += blockDim.x) dhs[(int64_t(t) * nb + j) * G + c] = df[r * ldf + H + c];
}

// The GRU backward of one step for nb sequences: dh [nb, G] holds ∂/∂h_t from the later steps and becomes the
// part of ∂/∂h_{t−1} that does not go through W_hh (u ⊙ dh; the caller adds dgh·W_hh); dhs adds the slots'
// own ∂/∂h_t. Writes the gate pre-activation gradients: dgi row j (stride ld_dgi) [dr, du, dn] for W_ih,
// dgh row j (stride 3G) [dr, du, dn ⊙ r] for W_hh (W_hn·h sits inside r ⊙).
__global__ void domino_gru_bwd_kernel(float* dh, const float* dhs, const float* hp, const float* gates,
                                      int64_t gate_stride, bf16* dgi, int64_t ld_dgi, bf16* dgh, int64_t nb,
                                      int G) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= nb * G) return;
  const int64_t j = i / G;
  const int g = int(i % G);
  const float r = gates[i], u = gates[gate_stride + i], n = gates[2 * gate_stride + i],
              hn = gates[3 * gate_stride + i];
  const float d = dh[i] + dhs[i];
  const float dn = d * (1.0f - u) * (1.0f - n * n);
  const float dr = dn * hn * r * (1.0f - r);
  const float du = d * (hp[i] - n) * u * (1.0f - u);
  bf16* gi = dgi + j * ld_dgi;
  bf16* gh = dgh + j * 3 * G;
  gi[g] = gh[g] = __float2bfloat16(dr);
  gi[G + g] = gh[G + g] = __float2bfloat16(du);
  gi[2 * G + g] = __float2bfloat16(dn);
  gh[2 * G + g] = __float2bfloat16(dn * r);
  dh[i] = d * u;
}

// x [H] = embed row tok[0].
__global__ void domino_embed_row_kernel(const bf16* embed, const int32_t* tok, int H, bf16* x) {
  const int64_t row = tok[0];
  for (int c = threadIdx.x; c < H; c += blockDim.x) x[c] = embed[row * H + c];
}

// ---- launchers ----

namespace {

void check_shape(const char* op, const DominoHeadShape& d) {
  DF_CHECK(d.nb >= 0 && d.B >= 2 && d.H >= 1 && d.G >= 1 && d.E >= 1 && d.V >= 1 && d.V <= INT_MAX &&
               (d.lag == 0 || d.lag == 1) && d.suffix_start >= d.lag && d.nb * d.B <= INT_MAX,
           "%s: bad head shape nb %lld B %d H %d G %d E %d V %d suffix_start %d lag %d", op, (long long)d.nb,
           d.B, d.H, d.G, d.E, d.V, d.suffix_start, d.lag);
}

}  // namespace

void domino_head_loss_launch(GemmContext* gemm, const DominoHeadShape& d, const bf16* y, int64_t ld_y,
                             const bf16* lm_head, const bf16* gru_in, int64_t ld_gru_in,
                             const DominoHeadWeightPtrs& w, const int32_t* labels, const float* row_w,
                             double lambda, int shift, bool backward, float beta_dw, int32_t* argmax,
                             bf16* dy, int64_t ld_dy, const DominoHeadGradPtrs& dw, double* stats,
                             int64_t chunk_rows, void* ws, size_t ws_bytes, cudaStream_t stream) {
  const char* op = "domino_head_loss_launch";
  check_shape(op, d);
  const int64_t nb = d.nb, N = nb * d.B, G3 = 3 * int64_t(d.G), HG = int64_t(d.H) + d.G;
  const int B = d.B, H = d.H, G = d.G, E = d.E, s = d.suffix_start, lag = d.lag, steps = B - lag;
  DF_CHECK(ld_y >= H && ld_gru_in >= H && (!backward || ld_dy >= H) && chunk_rows >= 1 &&
               (shift == 0 || shift == 1),
           "%s: a row stride is shorter than H %d (y %lld, gru_in %lld, dy %lld), or chunk_rows %lld < 1, or "
           "shift %d",
           op, H, (long long)ld_y, (long long)ld_gru_in, (long long)ld_dy, (long long)chunk_rows, shift);
  DF_CHECK(gemm && y && lm_head && gru_in && w.gru_ih && w.gru_hh && w.proj_in && w.proj_out && labels &&
               row_w && argmax && stats &&
               (!backward || (dy && dw.gru_ih && dw.gru_hh && dw.proj_in && dw.proj_out)),
           "%s: null pointer argument", op);
  if (N == 0) {
    if (backward && beta_dw == 0.0f) {  // an empty range still writes the gradients: zeros
      zero(dw.gru_ih, size_t(G3 * H) * 4, stream);
      zero(dw.gru_hh, size_t(G3 * G) * 4, stream);
      zero(dw.proj_in, size_t(E * HG) * 4, stream);
      zero(dw.proj_out, size_t(int64_t(d.V) * E) * 4, stream);
    }
    return;
  }
  const DominoLayout L = domino_head_layout(nb, B, H, G, E, d.V, chunk_rows);
  check_ws(op, ws, ws_bytes, L.bytes);
  float* xi = at<float>(ws, L.xi);
  float* hh = at<float>(ws, L.hh);
  float* hs = at<float>(ws, L.hs);
  bf16* hsb = at<bf16>(ws, L.hsb);
  float* gates = at<float>(ws, L.gates);
  bf16* fcat = at<bf16>(ws, L.fcat);
  float* m = at<float>(ws, L.m);
  bf16* a = at<bf16>(ws, L.a);
  const int64_t state = nb * G, gate_stride = int64_t(B) * state;

  // ---- forward: the GRU over every block's inputs, then the correction's input and activation ----
  gemm_launch_ex(gemm, gru_in, ld_gru_in, false, w.gru_ih, H, true, xi, G3, true, N, G3, H, 1.0f, 0.0f,
                 stream);
  zero(hs, size_t(state) * 4, stream);
  zero(hsb, size_t(state) * 2, stream);
  for (int t = 0; t < steps; ++t) {
    gemm_launch_ex(gemm, hsb + t * state, G, false, w.gru_hh, G, true, hh, G3, true, nb, G3, G, 1.0f, 0.0f,
                   stream);
    domino_gru_fwd_kernel<<<grid_of(state), kThreads, 0, stream>>>(
        xi + t * G3, B * G3, hh, hs + t * state, hs + (t + 1) * state, hsb + (t + 1) * state,
        gates + t * state, gate_stride, nb, G);
    DF_CUDA_CHECK_LAUNCH("domino_gru_fwd_kernel");
  }
  domino_fcat_kernel<<<unsigned(N), kThreads, 0, stream>>>(y, ld_y, hsb, nb, B, H, G, s, lag, fcat, L.ldf);
  DF_CUDA_CHECK_LAUNCH("domino_fcat_kernel");
  gemm_launch_ex(gemm, fcat, L.ldf, false, w.proj_in, HG, true, m, E, true, N, E, HG, 1.0f, 0.0f, stream);
  domino_silu_kernel<<<grid_of(N * E), kThreads, 0, stream>>>(m, a, N, E, B, s);
  DF_CUDA_CHECK_LAUNCH("domino_silu_kernel");

  // ---- the logits a chunk at a time: both losses, the row gradients, what flows back through the vocab ----
  float* base = at<float>(ws, L.base);
  float* corr = at<float>(ws, L.corr);
  bf16* gbase = at<bf16>(ws, L.gbase);
  bf16* gfin = at<bf16>(ws, L.gfin);
  float* da = at<float>(ws, L.da);
  float* df = at<float>(ws, L.df);
  if (backward) zero(df, size_t(N * L.ldf) * 4, stream);  // its h columns are added to after the chunks
  DominoRowArgs ra{base,
                   corr,
                   gbase,
                   gfin,
                   L.ldv,
                   0,
                   labels,
                   row_w,
                   argmax,
                   head_stat_rows(ws, L.stat, B, shift),
                   d.V,
                   float(lambda),
                   backward};
  for (int64_t p0 = 0; p0 < N; p0 += L.chunk) {
    const int64_t n = std::min(L.chunk, N - p0);
    gemm_launch_ex(gemm, y + p0 * ld_y, ld_y, false, lm_head, H, true, base, L.ldv, true, n, d.V, H, 1.0f,
                   0.0f, stream);
    gemm_launch_ex(gemm, a + p0 * E, E, false, w.proj_out, E, true, corr, L.ldv, true, n, d.V, E, 1.0f, 0.0f,
                   stream);
    ra.row0 = p0;
    domino_row_kernel<<<unsigned(n), kRowThreads, 0, stream>>>(ra);
    DF_CUDA_CHECK_LAUNCH("domino_row_kernel");
    if (!backward) continue;
    gemm_launch_ex(gemm, gbase, L.ldv, false, lm_head, H, false, df + p0 * L.ldf, L.ldf, true, n, H, d.V,
                   1.0f, 0.0f, stream);
    gemm_launch_ex(gemm, gfin, L.ldv, false, w.proj_out, E, false, da + p0 * E, E, true, n, E, d.V, 1.0f,
                   0.0f, stream);
    gemm_launch_ex(gemm, gfin, L.ldv, true, a + p0 * E, E, false, dw.proj_out, E, true, d.V, E, n, 1.0f,
                   p0 == 0 ? beta_dw : 1.0f, stream);
  }
  head_stats_launch(ra.stat, nb, stats, stream);
  if (!backward) return;

  // ---- backward: the correction MLP, then the GRU through time ----
  bf16* dm = at<bf16>(ws, L.dm);
  domino_dsilu_kernel<<<grid_of(N * E), kThreads, 0, stream>>>(da, m, dm, N, E, B, s);
  DF_CUDA_CHECK_LAUNCH("domino_dsilu_kernel");
  gemm_launch_ex(gemm, dm, E, true, fcat, L.ldf, false, dw.proj_in, HG, true, E, HG, N, 1.0f, beta_dw,
                 stream);
  gemm_launch_ex(gemm, dm, E, false, w.proj_in, HG, false, df, L.ldf, true, N, HG, E, 1.0f, 1.0f, stream);
  float* dh = at<float>(ws, L.dh);
  float* dhs = at<float>(ws, L.dhs);
  bf16* dgi = at<bf16>(ws, L.dgi);
  bf16* dgh = at<bf16>(ws, L.dgh);
  domino_dy_kernel<<<unsigned(N), kThreads, 0, stream>>>(df, L.ldf, dy, ld_dy, dhs, nb, B, H, G, lag);
  DF_CUDA_CHECK_LAUNCH("domino_dy_kernel");
  zero(dh, size_t(state) * 4, stream);
  if (steps < B) zero(dgi, size_t(N * G3) * 2, stream);  // the rows of inputs no state reads stay 0
  for (int t = steps - 1; t >= 0; --t) {
    domino_gru_bwd_kernel<<<grid_of(state), kThreads, 0, stream>>>(
        dh, dhs + t * state, hs + t * state, gates + t * state, gate_stride, dgi + t * G3, B * G3,
        dgh + t * state * 3, nb, G);
    DF_CUDA_CHECK_LAUNCH("domino_gru_bwd_kernel");
    if (t > 0)
      gemm_launch_ex(gemm, dgh + t * state * 3, G3, false, w.gru_hh, G, false, dh, G, true, nb, G, G3, 1.0f,
                     1.0f, stream);
  }
  gemm_launch_ex(gemm, dgi, G3, true, gru_in, ld_gru_in, false, dw.gru_ih, H, true, G3, H, N, 1.0f, beta_dw,
                 stream);
  gemm_launch_ex(gemm, dgh, G3, true, hsb, G, false, dw.gru_hh, G, true, G3, G, int64_t(steps) * nb, 1.0f,
                 beta_dw, stream);
}

const int32_t* domino_head_propose_launch(GemmContext* gemm, const DominoHeadShape& d, const bf16* y,
                                          int64_t ld_y, const bf16* lm_head, const bf16* embed,
                                          const DominoHeadWeightPtrs& w, int shift, int32_t first, void* ws,
                                          size_t ws_bytes, cudaStream_t stream) {
  const char* op = "domino_head_propose_launch";
  check_shape(op, d);
  DF_CHECK(d.nb == 1 && ld_y >= d.H && (shift == 0 || shift == 1) && first >= 0 && first < d.V,
           "%s: one block (nb %lld), y stride %lld ≥ H %d, shift %d, first token %d in [0, %d)", op,
           (long long)d.nb, (long long)ld_y, d.H, shift, first, d.V);
  DF_CHECK(gemm && y && lm_head && embed && w.gru_ih && w.gru_hh && w.proj_in && w.proj_out,
           "%s: null pointer argument", op);
  const int B = d.B, H = d.H, G = d.G, E = d.E;
  const int64_t G3 = 3 * int64_t(G), HG = int64_t(H) + G;
  const DominoProposeLayout L = domino_propose_layout(B, H, G, E, d.V);
  check_ws(op, ws, ws_bytes, L.bytes);
  float* base = at<float>(ws, L.base);
  float* fin = at<float>(ws, L.fin);
  bf16* x = at<bf16>(ws, L.x);
  float* xi = at<float>(ws, L.xi);
  float* hh = at<float>(ws, L.hh);
  float* h = at<float>(ws, L.h);
  bf16* hb = at<bf16>(ws, L.hb);
  bf16* f = at<bf16>(ws, L.f);
  float* m = at<float>(ws, L.m);
  bf16* a = at<bf16>(ws, L.a);
  int32_t* tok = at<int32_t>(ws, L.tok);
  gemm_launch_ex(gemm, y, ld_y, false, lm_head, H, true, base, L.ldv, true, B, d.V, H, 1.0f, 0.0f, stream);
  // From pageable memory: the copy has read `first` when it returns.
  DF_CUDA_CHECK(cudaMemcpyAsync(tok, &first, sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  zero(h, size_t(G) * 4, stream);
  zero(hb, size_t(G) * 2, stream);
  for (int p = 1; p < B; ++p) {
    // The GRU state after tokens 0..p−1, the drafter's own proposals after the first.
    domino_embed_row_kernel<<<1, kThreads, 0, stream>>>(embed, tok + p - 1, H, x);
    DF_CUDA_CHECK_LAUNCH("domino_embed_row_kernel");
    gemm_launch_ex(gemm, x, H, false, w.gru_ih, H, true, xi, G3, true, 1, G3, H, 1.0f, 0.0f, stream);
    gemm_launch_ex(gemm, hb, G, false, w.gru_hh, G, true, hh, G3, true, 1, G3, G, 1.0f, 0.0f, stream);
    domino_gru_fwd_kernel<<<grid_of(G), kThreads, 0, stream>>>(xi, G3, hh, h, h, hb, nullptr, 0, 1, G);
    DF_CUDA_CHECK_LAUNCH("domino_gru_fwd_kernel");
    const int slot = p - shift;
    const float* logits = base + int64_t(slot) * L.ldv;
    if (slot >= d.suffix_start) {
      DF_CUDA_CHECK(
          cudaMemcpyAsync(f, y + int64_t(slot) * ld_y, size_t(H) * 2, cudaMemcpyDeviceToDevice, stream));
      DF_CUDA_CHECK(cudaMemcpyAsync(f + H, hb, size_t(G) * 2, cudaMemcpyDeviceToDevice, stream));
      gemm_launch_ex(gemm, f, HG, false, w.proj_in, HG, true, m, E, true, 1, E, HG, 1.0f, 0.0f, stream);
      domino_silu_kernel<<<grid_of(E), kThreads, 0, stream>>>(m, a, 1, E, 1, 0);
      DF_CUDA_CHECK_LAUNCH("domino_silu_kernel");
      gemm_launch_addend(gemm, a, E, false, w.proj_out, E, true, logits, L.ldv, fin, L.ldv, true, 1, d.V, E,
                         1.0f, 1.0f, stream);
      logits = fin;
    }
    row_argmax_launch(logits, d.V, tok + p, stream);
  }
  return tok;
}

}  // namespace df
