// Incremental decoding's fast Gated DeltaNet step (kernels/decode/decode.cuh; decode.cu has the launcher, its checks and
// the general kernel): a slice of a value head's fp32 state per CTA, kept in registers over all the step's
// tokens, launched with programmatic dependent launch (pdl.cuh).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/decode/decode.cuh"
#include "kernels/launchers.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/primitives/mma.cuh"
#include "kernels/primitives/pdl.cuh"

namespace df {

namespace {

// ---- Gated DeltaNet decode: 32-column slices (dv not a multiple of 4, unaligned states) ---------------------
// Block (h, slice): columns j = 32·slice + lane of value head h's state S [dk, dv], warp w holding rows
// [w·PER, (w + 1)·PER) of its lane's column in registers over all T tokens, so each saved state goes out as
// 128-byte row pieces. Per token, as gdn_decode_kernel: S = exp(g)·S; u = β·(v − Sᵀk̂); S += k̂·uᵀ; o = Sᵀq̂; the
// sums over dk are per-warp partials added through shared memory. q̂, k̂ and the gates of kGdnSliceTokens
// tokens are computed once per block (a warp per token) and staged in shared memory.
constexpr int kGdnSliceWarps = 8;
constexpr int kGdnSliceTokens = 8;

template <int PER>
__global__ void __launch_bounds__(32 * kGdnSliceWarps) gdn_decode_slice_kernel(
    const bf16* __restrict__ qkv, int64_t ld_qkv, const bf16* __restrict__ a_in, int64_t ld_a,
    const bf16* __restrict__ b_in, int64_t ld_b, const float* __restrict__ A_log, const float* __restrict__ dt_bias,
    bf16* __restrict__ out, int64_t ld_out, const float* __restrict__ state, float* __restrict__ states,
    int64_t ld_states, int64_t T, int64_t first_saved, int nk, int nv, int dk, int dv) {
  constexpr int DKP = kGdnSliceWarps * PER;  // dk rounded up; the rows past dk are zero
  __shared__ float sq[kGdnSliceTokens][DKP], sk[kGdnSliceTokens][DKP], sv[kGdnSliceTokens][32];
  __shared__ float sdecay[kGdnSliceTokens], sbeta[kGdnSliceTokens];
  __shared__ float red_u[kGdnSliceWarps][32], red_o[kGdnSliceWarps][32];
  const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j = blockIdx.y * 32 + lane, e0 = warp * PER;
  const bool col = j < dv;  // lanes past dv carry zeros and write nothing, but keep the barriers
  const int kh = h / (nv / nk);
  const int64_t head0 = (int64_t)h * dk * dv;
  pdl_wait();
  float S[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) S[i] = col && e0 + i < dk ? state[head0 + (int64_t)(e0 + i) * dv + j] : 0.0f;
  const float q_scale = rsqrtf(static_cast<float>(dk)), neg_a = -expf(A_log[h]);
  for (int64_t t0 = 0; t0 < T; t0 += kGdnSliceTokens) {
    const int n = (int)min((int64_t)kGdnSliceTokens, T - t0);
    __syncthreads();  // the previous tokens' staged values are no longer read
    for (int tt = warp; tt < n; tt += kGdnSliceWarps) {
      const bf16* row = qkv + (t0 + tt) * ld_qkv;
      float qss = 0.0f, kss = 0.0f;
      for (int e = lane; e < DKP; e += 32) {
        float qe, ke;
        gdn_load_qk(row, nk, kh, dk, e, qe, ke);
        sq[tt][e] = qe;
        sk[tt][e] = ke;
        qss += qe * qe;
        kss += ke * ke;
      }
      const float qi = rsqrtf(warp_sum(qss) + 1e-6f) * q_scale, ki = rsqrtf(warp_sum(kss) + 1e-6f);
      for (int e = lane; e < DKP; e += 32) {  // the lane's own elements: no barrier needed
        sq[tt][e] *= qi;
        sk[tt][e] *= ki;
      }
      if (lane == 0) {
        const float x = __bfloat162float(a_in[(t0 + tt) * ld_a + h]) + dt_bias[h];
        sdecay[tt] = expf(neg_a * (x > 20.0f ? x : log1pf(expf(x))));  // torch softplus, threshold 20
        sbeta[tt] = sigmoid_f32(__bfloat162float(b_in[(t0 + tt) * ld_b + h]));
      }
      sv[tt][lane] = col ? __bfloat162float(row[2LL * nk * dk + (int64_t)h * dv + j]) : 0.0f;
    }
    __syncthreads();
    for (int tt = 0; tt < n; ++tt) {
      const int64_t t = t0 + tt;
      const float decay = sdecay[tt];
      float u = 0.0f;
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        S[i] *= decay;
        u += sk[tt][e0 + i] * S[i];
      }
      red_u[warp][lane] = u;
      __syncthreads();
      u = 0.0f;
#pragma unroll
      for (int w = 0; w < kGdnSliceWarps; ++w) u += red_u[w][lane];
      u = sbeta[tt] * (sv[tt][lane] - u);
      float o = 0.0f;
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        S[i] += sk[tt][e0 + i] * u;
        o += sq[tt][e0 + i] * S[i];
      }
      red_o[warp][lane] = o;
      if (t >= first_saved && col) {
        float* dst = states + (t - first_saved) * ld_states + head0 + j;
#pragma unroll
        for (int i = 0; i < PER; ++i)
          if (e0 + i < dk) __stcs(dst + (int64_t)(e0 + i) * dv, S[i]);  // streamed: read back at most once
      }
      __syncthreads();  // red_o complete; red_u free for the next token
      if (warp == 0 && col) {
        o = 0.0f;
#pragma unroll
        for (int w = 0; w < kGdnSliceWarps; ++w) o += red_o[w][lane];
        out[t * ld_out + (int64_t)h * dv + j] = __float2bfloat16(o);
      }
    }
  }
}

// ---- Gated DeltaNet decode: 16-column slices, four columns a thread ---------------------------------------
// Block (h, slice): columns [16·slice, +16) of value head h's state S [dk, dv] (dv a multiple of 4, 16-byte
// aligned rows), 128 threads: lane & 3 picks a float4 of columns, the 32 (warp, lane >> 2) row groups hold
// RPT consecutive rows each, so state loads and saved-state stores are 16-byte vectors and a warp instruction
// covers 8 rows × 64 bytes. Twice the CTAs of the 32-column slices (384 at 48 heads × 128) spreads the bytes
// over every SM nearly evenly (2.9 CTAs an SM, where 192 left 72 SMs one and 60 two). Per token, as
// gdn_decode_kernel: S = exp(g)·S; u = β·(v − Sᵀk̂); S += k̂·uᵀ; o = Sᵀq̂, the sums over dk by shuffles over
// the warp's row groups and then over the 4 warps through shared memory. The partial sums are double-buffered
// by token parity, so a token costs one barrier: token t's output is summed after token t + 1's barrier. The
// inputs (q̂, k̂, v, gates) of up to TOK tokens are staged first, each token's by one warp, all warps sharing.
constexpr int kGdnQuadWarps = 4;

// One token's 4 output columns of gdn_decode_quad_kernel: the warps' partial sums red[w][cq] added and rounded.
__device__ __forceinline__ void gdn_quad_out(const float4 (*red)[4], int cq, bf16* dst) {
  float4 o = red[0][cq];
#pragma unroll
  for (int w = 1; w < kGdnQuadWarps; ++w) {
    const float4 x = red[w][cq];
    o.x += x.x;
    o.y += x.y;
    o.z += x.z;
    o.w += x.w;
  }
  dst[0] = __float2bfloat16(o.x);
  dst[1] = __float2bfloat16(o.y);
  dst[2] = __float2bfloat16(o.z);
  dst[3] = __float2bfloat16(o.w);
}

template <int RPT>
__global__ void __launch_bounds__(32 * kGdnQuadWarps) gdn_decode_quad_kernel(
    const bf16* __restrict__ qkv, int64_t ld_qkv, const bf16* __restrict__ a_in, int64_t ld_a,
    const bf16* __restrict__ b_in, int64_t ld_b, const float* __restrict__ A_log, const float* __restrict__ dt_bias,
    bf16* __restrict__ out, int64_t ld_out, const float* __restrict__ state, float* __restrict__ states,
    int64_t ld_states, int64_t T, int64_t first_saved, int nk, int nv, int dk, int dv) {
  constexpr int DKP = 32 * RPT;                           // dk rounded up; the rows past dk are zero
  constexpr int TOK = DKP <= 128 ? 16 : 2048 / DKP;        // staged tokens: 16 KB of q̂, k̂ at most
  __shared__ __align__(16) float sq[TOK][DKP];
  __shared__ __align__(16) float sk[TOK][DKP];
  __shared__ __align__(16) float sv[TOK][kGdnQuadCols];  // read as float4s
  __shared__ float sdecay[TOK], sbeta[TOK];
  __shared__ float4 red_u[2][kGdnQuadWarps][4], red_o[2][kGdnQuadWarps][4];
  const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, cq = lane & 3;
  const int c0 = blockIdx.y * kGdnQuadCols, j = c0 + 4 * cq, e0 = (warp * 8 + (lane >> 2)) * RPT;
  const bool col = j < dv;  // quads past dv carry zeros and write nothing, but keep the barriers
  const int kh = h / (nv / nk);
  const int64_t head0 = (int64_t)h * dk * dv;
  pdl_wait();
  pdl_launch_dependents();
  float4 S[RPT];
#pragma unroll
  for (int i = 0; i < RPT; ++i)
    S[i] = col && e0 + i < dk ? *reinterpret_cast<const float4*>(state + head0 + (int64_t)(e0 + i) * dv + j)
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float q_scale = rsqrtf(static_cast<float>(dk)), neg_a = -expf(A_log[h]), dtb = dt_bias[h];
  // Token t's output goes out once a later barrier has made its red_o complete: warp 0's lanes 0..3 (cq = lane).
  const bool writer = warp == 0 && lane < 4 && col;
  bf16* const out_h = out + (int64_t)h * dv + j;
  for (int64_t t0 = 0; t0 < T; t0 += TOK) {
    const int n = (int)min((int64_t)TOK, T - t0);
    __syncthreads();  // the previous tokens' staged values are no longer read
    for (int tt = warp; tt < n; tt += kGdnQuadWarps) {
      const int64_t t = t0 + tt;
      const bf16* row = qkv + t * ld_qkv;
      // Every load of the token first, then the sums: one round trip, not one per dependent step.
      const float xa = __bfloat162float(a_in[t * ld_a + h]), xb = __bfloat162float(b_in[t * ld_b + h]);
      const float xv = lane < kGdnQuadCols && c0 + lane < dv
                           ? __bfloat162float(row[2LL * nk * dk + (int64_t)h * dv + c0 + lane]) : 0.0f;
      float qe[RPT], ke[RPT], qss = 0.0f, kss = 0.0f;
#pragma unroll
      for (int m = 0; m < RPT; ++m) gdn_load_qk(row, nk, kh, dk, lane + 32 * m, qe[m], ke[m]);
#pragma unroll
      for (int m = 0; m < RPT; ++m) {
        qss += qe[m] * qe[m];
        kss += ke[m] * ke[m];
      }
      const float qi = rsqrtf(warp_sum(qss) + 1e-6f) * q_scale, ki = rsqrtf(warp_sum(kss) + 1e-6f);
#pragma unroll
      for (int m = 0; m < RPT; ++m) {
        sq[tt][lane + 32 * m] = qe[m] * qi;
        sk[tt][lane + 32 * m] = ke[m] * ki;
      }
      if (lane < kGdnQuadCols) sv[tt][lane] = xv;
      if (lane == 0) {
        const float x = xa + dtb;
        sdecay[tt] = expf(neg_a * (x > 20.0f ? x : log1pf(expf(x))));  // torch softplus, threshold 20
        sbeta[tt] = sigmoid_f32(xb);
      }
    }
    __syncthreads();
    for (int tt = 0; tt < n; ++tt) {
      const int64_t t = t0 + tt;
      const int p = (int)(t & 1);
      const float decay = sdecay[tt];
      float4 u = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int i = 0; i < RPT; ++i) {
        const float kk = sk[tt][e0 + i];
        S[i].x *= decay;
        S[i].y *= decay;
        S[i].z *= decay;
        S[i].w *= decay;
        u.x += kk * S[i].x;
        u.y += kk * S[i].y;
        u.z += kk * S[i].z;
        u.w += kk * S[i].w;
      }
#pragma unroll
      for (int o = 4; o <= 16; o <<= 1) {  // over the warp's 8 row groups (lane bits 2..4)
        u.x += __shfl_xor_sync(0xffffffffu, u.x, o);
        u.y += __shfl_xor_sync(0xffffffffu, u.y, o);
        u.z += __shfl_xor_sync(0xffffffffu, u.z, o);
        u.w += __shfl_xor_sync(0xffffffffu, u.w, o);
      }
      if (lane < 4) red_u[p][warp][lane] = u;
      __syncthreads();  // red_u[p] complete; red_o[p ^ 1] (token t - 1) complete
      if (t > 0 && writer) gdn_quad_out(red_o[(t - 1) & 1], lane, out_h + (t - 1) * ld_out);
      u = red_u[p][0][cq];
#pragma unroll
      for (int w = 1; w < kGdnQuadWarps; ++w) {
        const float4 x = red_u[p][w][cq];
        u.x += x.x;
        u.y += x.y;
        u.z += x.z;
        u.w += x.w;
      }
      const float beta = sbeta[tt];
      const float4 v = *reinterpret_cast<const float4*>(&sv[tt][4 * cq]);
      u = make_float4(beta * (v.x - u.x), beta * (v.y - u.y), beta * (v.z - u.z), beta * (v.w - u.w));
      float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int i = 0; i < RPT; ++i) {
        const float kk = sk[tt][e0 + i], qq = sq[tt][e0 + i];
        S[i].x += kk * u.x;
        S[i].y += kk * u.y;
        S[i].z += kk * u.z;
        S[i].w += kk * u.w;
        o.x += qq * S[i].x;
        o.y += qq * S[i].y;
        o.z += qq * S[i].z;
        o.w += qq * S[i].w;
      }
#pragma unroll
      for (int s = 4; s <= 16; s <<= 1) {
        o.x += __shfl_xor_sync(0xffffffffu, o.x, s);
        o.y += __shfl_xor_sync(0xffffffffu, o.y, s);
        o.z += __shfl_xor_sync(0xffffffffu, o.z, s);
        o.w += __shfl_xor_sync(0xffffffffu, o.w, s);
      }
      if (lane < 4) red_o[p][warp][lane] = o;
      if (t >= first_saved && col) {
        float* dst = states + (t - first_saved) * ld_states + head0 + j;
#pragma unroll
        for (int i = 0; i < RPT; ++i)  // streamed: read back at most once
          if (e0 + i < dk) __stcs(reinterpret_cast<float4*>(dst + (int64_t)(e0 + i) * dv), S[i]);
      }
    }
  }
  __syncthreads();
  if (writer) gdn_quad_out(red_o[(T - 1) & 1], lane, out_h + (T - 1) * ld_out);
}

// ---- launchers ----------------------------------------------------------------------------------------

// DeltaNet state rows per warp of gdn_decode_slice_kernel: dk / 8 rounded up to 4, 8, 16, 32 or 64.
template <class Fn>
void dispatch_slice_rows(int dk, Fn&& fn) {
  dispatch_pow2<4, kDecodeMaxHeadDim / kGdnSliceWarps>((dk + 7) / 8, fn);
}

// DeltaNet state rows per thread of gdn_decode_quad_kernel: dk / 32 rounded up to 2, 4, 8 or 16 (dk <= 32 runs
// with 2 and zero rows: ptxas spilled the 1-row build, and no model has so small a key head).
template <class Fn>
void dispatch_quad_rows(int dk, Fn&& fn) {
  dispatch_pow2<2, kDecodeMaxHeadDim / 32>((dk + 31) / 32, fn);
}

}  // namespace

void gdn_decode_slice_run(GdnDecodeKernel kernel, const bf16* qkv, int64_t ld_qkv, const bf16* a,
                          int64_t ld_a, const bf16* b, int64_t ld_b, const float* A_log, const float* dt_bias,
                          bf16* out, int64_t ld_out, const float* state, float* states, int64_t ld_states,
                          int64_t saved, int64_t T, int nk, int nv, int dk, int dv, cudaStream_t stream) {
  if (kernel == GdnDecodeKernel::quad) {
    const dim3 grid((unsigned)nv, (unsigned)((dv + kGdnQuadCols - 1) / kGdnQuadCols));
    dispatch_quad_rows(dk, [&](auto rpt) {
      launch_pdl(gdn_decode_quad_kernel<decltype(rpt)::value>, grid, dim3(32 * kGdnQuadWarps), 0, stream, qkv,
                 ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, state, states, ld_states, T,
                 T - saved, nk, nv, dk, dv);
    });
    return;
  }
  const dim3 grid((unsigned)nv, (unsigned)((dv + 31) / 32));
  dispatch_slice_rows(dk, [&](auto per) {
    launch_pdl(gdn_decode_slice_kernel<decltype(per)::value>, grid, dim3(32 * kGdnSliceWarps), 0, stream, qkv,
               ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, state, states, ld_states, T, T - saved, nk,
               nv, dk, dv);
  });
}

}  // namespace df
