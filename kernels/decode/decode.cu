// Incremental decoding kernels (ops.h "incremental decoding"): attention of a step's new queries over a
// sequence's key/value cache, and the Gated DeltaNet recurrence continued token by token from a carried
// state. A decode step moves far more bytes (the cache; the state and the per-token states kept for rollback)
// than it computes with, so the fast kernels are built to read those bytes once:
// - attention (hd 128 / 256): split-KV on tensor cores (decode_fast.cu). A CTA per (kv head, key chunk, row
//   group), at most one per SM, streams its chunk through a cp.async ring and runs the query rows that read
//   it (of the step's T tokens × the hq / hkv query heads of that kv head) through mma.sync with an online
//   softmax; short steps split each stage's keys over several warps (merged in shared memory), so T = 1 still
//   has its SMs' tensor cores and copies busy. A second kernel merges the chunks' (max, sum, acc), gates and
//   rounds, its blocks splitting each row's columns so a one-token step still spreads over the SMs. How a
//   step is split, and whether it fits the device's shared memory at all, is the plan's decision
//   (decode_plan.h).
// - DeltaNet: a CTA per (value head, 16 state columns) keeps that slice of the fp32 state in registers over
//   the tokens (a float4 of columns a thread) and writes each saved state as 16-byte vectors; a 32-column
//   slice kernel with a column a lane takes dv not a multiple of 4 or unaligned states (decode_gdn.cu).
// This file holds the launchers and the general warp-per-work-item kernels (fp32, any head dim up to
// kDecodeMaxHeadDim, any stride or GQA / GVA ratio), which take the shapes the fast ones are not built for
// and the steps whose split plan does not fit the device, and are the prefill's fallback (causal attention
// over packed sequences; the recurrence from zero states per sequence). Tests and benchmarks send decoding to
// them as well (the registry's decode=general, kernels/dispatch/dispatch.h), to test that path on a device
// that would not take it and as a reference for the fast kernels. Which kernel a step takes is decided in
// decode_plan.h (decode_attention_choose, gdn_decode_choose).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/decode/decode.cuh"
#include "kernels/launchers.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/primitives/mma.cuh"

namespace df {

namespace {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = 32 * kDecodeWarps;
constexpr int kDecodeMaxPerLane = kDecodeMaxHeadDim / 32;

// ---- attention over a cache, or causal over packed sequences ------------------------------------------
// Block (t, h): query row t of head h. Over a cache (cu == nullptr) it sits at position past + t and sees key
// rows [0, past + t]; over packed sequences (cu [num_seqs + 1] offsets) it sees its own sequence's rows
// [cu[s], t]. Each warp runs an online softmax over every kDecodeWarps-th key of kv head h / group, lanes
// holding dims lane, lane + 32, ...; the warps' partial (max, sum, acc) are merged through shared memory.
template <int PL>
__global__ void __launch_bounds__(kDecodeThreads) attention_cached_kernel(
    const bf16* __restrict__ q, int64_t ld_q, const bf16* __restrict__ k, int64_t ld_k, const bf16* __restrict__ v,
    int64_t ld_v, bf16* __restrict__ out, int64_t ld_out, const bf16* __restrict__ gate, int64_t ld_gate,
    int64_t past, const int32_t* __restrict__ cu, int num_seqs, int hq, int hkv, int hd, float scale) {
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kvh = h / (hq / hkv);
  const bf16* qrow = q + t * ld_q + (int64_t)h * hd;
  float qr[PL], acc[PL];
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < hd ? __bfloat162float(qrow[d]) * scale : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  int64_t first = 0, last = past + t;  // key rows, inclusive; warp 0 always has one
  if (cu) {
    int lo = 0, hi = num_seqs;  // the sequence s with cu[s] <= t < cu[s + 1]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (cu[mid] <= t) lo = mid; else hi = mid;
    }
    first = cu[lo];
    last = t;
  }
  for (int64_t j = first + warp; j <= last; j += kDecodeWarps) {
    const bf16* krow = k + j * ld_k + (int64_t)kvh * hd;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) s += qr[i] * __bfloat162float(krow[d]);
    }
    s = warp_sum(s);
    const float m_new = fmaxf(m, s), c = expf(m - m_new), p = expf(s - m_new);
    l = l * c + p;
    const bf16* vrow = v + j * ld_v + (int64_t)kvh * hd;
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * c + (d < hd ? p * __bfloat162float(vrow[d]) : 0.0f);
    }
    m = m_new;
  }
  extern __shared__ float smem[];  // [warps] max, [warps] sum, [warps][hd] acc
  float* sm = smem;
  float* sl = smem + kDecodeWarps;
  float* sacc = smem + 2 * kDecodeWarps;
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) sacc[warp * hd + d] = acc[i];
  }
  __syncthreads();
  float mt = -INFINITY;
  for (int w = 0; w < kDecodeWarps; ++w) mt = fmaxf(mt, sm[w]);
  float lt = 0.0f;
  for (int w = 0; w < kDecodeWarps; ++w) lt += sm[w] == -INFINITY ? 0.0f : sl[w] * expf(sm[w] - mt);
  bf16* orow = out + t * ld_out + (int64_t)h * hd;
  const bf16* grow = gate ? gate + t * ld_gate + (int64_t)h * hd : nullptr;
  for (int d = threadIdx.x; d < hd; d += kDecodeThreads) {
    float o = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w)
      if (sm[w] != -INFINITY) o += sacc[w * hd + d] * expf(sm[w] - mt);
    o = bf16_rn(o / lt);
    if (grow) o = sigmoid_gate_f32(o, __bfloat162float(grow[d]));
    orow[d] = __float2bfloat16(o);
  }
}

// ---- Gated DeltaNet by the token recurrence ----------------------------------------------------------
// Block (h, column tile, sequence): warp w owns column j of value head h's state S [dk, dv], lanes holding
// rows e = lane, lane + 32, ... in registers for the whole sequence. Decoding: one sequence [0, T) from a
// carried state, saving the states from token first_saved on; the prefill fallback: the packed sequences of
// cu from zero states, saving none. Per token, as cpu_gdn.cpp gdn_token: S = exp(g)·S;
// u = β·(v − Sᵀk̂); S += k̂·uᵀ; o = Sᵀq̂, with q̂ = l2norm(q)·dk^−½, k̂ = l2norm(k) (each warp normalises its
// own copy: dk values, one warp sum each).
template <int PL>
__global__ void __launch_bounds__(kDecodeThreads) gdn_decode_kernel(
    const bf16* __restrict__ qkv, int64_t ld_qkv, const bf16* __restrict__ a_in, int64_t ld_a,
    const bf16* __restrict__ b_in, int64_t ld_b, const float* __restrict__ A_log, const float* __restrict__ dt_bias,
    bf16* __restrict__ out, int64_t ld_out, const float* __restrict__ state, float* __restrict__ states,
    int64_t ld_states, const int32_t* __restrict__ cu, int64_t T, int64_t first_saved, int nk, int nv, int dk,
    int dv) {
  const int h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j = blockIdx.y * kDecodeWarps + warp;
  if (j >= dv) return;  // whole warps only: no block-wide barrier below
  const int64_t t0 = cu ? cu[blockIdx.z] : 0, t1 = cu ? cu[blockIdx.z + 1] : T;
  const int kh = h / (nv / nk);
  const int64_t hs = (int64_t)dk * dv, head0 = (int64_t)h * hs;
  float S[PL];
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    const int e = lane + 32 * i;
    S[i] = e < dk && state ? state[head0 + (int64_t)e * dv + j] : 0.0f;
  }
  const float q_scale = rsqrtf(static_cast<float>(dk)), neg_a = -expf(A_log[h]);
  for (int64_t t = t0; t < t1; ++t) {
    const bf16* row = qkv + t * ld_qkv;
    float qv[PL], kv[PL], qss = 0.0f, kss = 0.0f;
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      gdn_load_qk(row, nk, kh, dk, lane + 32 * i, qv[i], kv[i]);
      qss += qv[i] * qv[i];
      kss += kv[i] * kv[i];
    }
    const float qi = rsqrtf(warp_sum(qss) + 1e-6f) * q_scale, ki = rsqrtf(warp_sum(kss) + 1e-6f);
    const float x = __bfloat162float(a_in[t * ld_a + h]) + dt_bias[h];
    const float decay = expf(neg_a * (x > 20.0f ? x : log1pf(expf(x))));  // torch softplus, threshold 20
    const float beta = sigmoid_f32(__bfloat162float(b_in[t * ld_b + h]));
    const float vj = __bfloat162float(row[2LL * nk * dk + (int64_t)h * dv + j]);
    float u = 0.0f;
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      S[i] *= decay;
      u += kv[i] * ki * S[i];
    }
    u = beta * (vj - warp_sum(u));
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      S[i] += kv[i] * ki * u;
      o += qv[i] * qi * S[i];
    }
    o = warp_sum(o);
    if (lane == 0) out[t * ld_out + (int64_t)h * dv + j] = __float2bfloat16(o);
    if (states && t - t0 >= first_saved) {
      float* dst = states + (t - t0 - first_saved) * ld_states + head0 + j;
#pragma unroll
      for (int i = 0; i < PL; ++i) {
        const int e = lane + 32 * i;
        if (e < dk) dst[(int64_t)e * dv] = S[i];
      }
    }
  }
}

// Registers per lane for a head dim: the smallest of 1, 2, 4, 8, 16 covering it (kernels are built for those).
template <class Fn>
void dispatch_per_lane(int dim, Fn&& fn) {
  dispatch_pow2<1, kDecodeMaxPerLane>((dim + 31) / 32, fn);
}

// One block per (query row, head) of attention_cached_kernel, over a cache (cu == nullptr) or over packed
// sequences; `who` names the launcher in errors.
void attention_rows_run(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v, int64_t ld_v,
                        bf16* out, int64_t ld_out, const bf16* gate, int64_t ld_gate, int64_t rows, int64_t past,
                        const int32_t* cu, int num_seqs, int hq, int hkv, int hd, float scale, const char* who,
                        cudaStream_t stream) {
  if (hd <= 0 || hd > kDecodeMaxHeadDim || hkv <= 0 || hq % hkv != 0 || past < 0 || hq > 65535)
    cuda_throw(who, "needs 0 < head_dim <= 512, q heads a multiple of kv heads, past >= 0 and at most 65535 heads",
               __FILE__, __LINE__);
  const size_t smem = sizeof(float) * (size_t)kDecodeWarps * (2 + hd);
  dispatch_per_lane(hd, [&](auto pl) {
    attention_cached_kernel<decltype(pl)::value><<<dim3((unsigned)rows, (unsigned)hq), kDecodeThreads, smem, stream>>>(
        q, ld_q, k, ld_k, v, ld_v, out, ld_out, gate, ld_gate, past, cu, num_seqs, hq, hkv, hd, scale);
  });
  DF_CUDA_CHECK_LAUNCH("attention_cached_kernel");
}

void gdn_recurrence_run(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b, int64_t ld_b,
                        const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out, const float* state,
                        float* states, int64_t ld_states, const int32_t* cu, int num_seqs, int64_t T,
                        int64_t first_saved, int nk, int nv, int dk, int dv, const char* who, cudaStream_t stream) {
  if (nk <= 0 || nv % nk != 0 || dk <= 0 || dk > kDecodeMaxHeadDim || dv <= 0 || num_seqs > 65535)
    cuda_throw(who, "needs value heads a multiple of key heads, 0 < dk <= 512, dv > 0 and at most 65535 "
               "sequences", __FILE__, __LINE__);
  const dim3 grid((unsigned)nv, (unsigned)((dv + kDecodeWarps - 1) / kDecodeWarps), (unsigned)num_seqs);
  dispatch_per_lane(dk, [&](auto pl) {
    gdn_decode_kernel<decltype(pl)::value><<<grid, kDecodeThreads, 0, stream>>>(
        qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, state, states, ld_states, cu, T, first_saved,
        nk, nv, dk, dv);
  });
  DF_CUDA_CHECK_LAUNCH("gdn_decode_kernel");
}

}  // namespace

size_t attention_cached_workspace_bytes(int64_t T, int hq, int hkv, int hd) {
  if (T <= 0 || hkv <= 0 || hq % hkv != 0 || kernel_variants().decode_general ||
      !attention_split_shape(T, hq, hkv, hd))
    return 0;
  return attention_split_workspace_bytes_for(T, hq, hkv, hd, device_caps().sms);
}

void attention_cached_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v, int64_t ld_v,
                             bf16* out, int64_t ld_out, const bf16* gate, int64_t ld_gate, int64_t T, int64_t past,
                             int hq, int hkv, int hd, float scale, void* workspace, size_t workspace_bytes,
                             cudaStream_t stream) {
  if (T == 0) return;
  const uintptr_t rows_at =
      reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v);
  const bool aligned = rows_at % 16 == 0 && ld_q % 8 == 0 && ld_k % 8 == 0 && ld_v % 8 == 0;
  const DecodeAttnChoice c =
      hkv > 0 && hq % hkv == 0 && past >= 0
          ? decode_attention_choose(device_caps(), kernel_variants(), T, past, hq, hkv, hd, aligned)
          : DecodeAttnChoice{};
  if (c.kernel == DecodeAttnKernel::general)
    return attention_rows_run(q, ld_q, k, ld_k, v, ld_v, out, ld_out, gate, ld_gate, T, past, nullptr, 0, hq, hkv,
                              hd, scale, "attention_cached_launch", stream);
  if (workspace_bytes < attention_cached_workspace_bytes(T, hq, hkv, hd))
    cuda_throw("attention_cached_launch", "workspace smaller than attention_cached_workspace_bytes(T, hq, hkv, hd)",
               __FILE__, __LINE__);
  attention_split_run(c.plan, q, ld_q, k, ld_k, v, ld_v, out, ld_out, gate, ld_gate, T, past, hq, hkv, hd,
                      scale, workspace, stream);
}

void attention_causal_general_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                     int64_t ld_v, bf16* out, int64_t ld_out, const bf16* gate, int64_t ld_gate,
                                     const int32_t* cu, int num_seqs, int64_t tokens, int hq, int hkv, int hd,
                                     float scale, cudaStream_t stream) {
  if (tokens == 0 || num_seqs == 0) return;
  attention_rows_run(q, ld_q, k, ld_k, v, ld_v, out, ld_out, gate, ld_gate, tokens, 0, cu, num_seqs, hq, hkv, hd,
                     scale, "attention_causal_general_launch", stream);
}

void gdn_decode_launch(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b, int64_t ld_b,
                       const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out, const float* state,
                       float* states, int64_t ld_states, int64_t saved, int64_t T, int nk, int nv, int dk, int dv,
                       cudaStream_t stream) {
  if (T == 0) return;
  if (saved < 1 || saved > T)
    cuda_throw("gdn_decode_launch", "needs 1 <= saved states <= tokens", __FILE__, __LINE__);
  const bool vec = dv % 4 == 0 && ld_states % 4 == 0 &&
                   (reinterpret_cast<uintptr_t>(state) | reinterpret_cast<uintptr_t>(states)) % 16 == 0;
  const GdnDecodeKernel kernel = gdn_decode_choose(kernel_variants(), vec, dv);
  if (kernel == GdnDecodeKernel::general)
    return gdn_recurrence_run(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, state, states, ld_states,
                              nullptr, 1, T, T - saved, nk, nv, dk, dv, "gdn_decode_launch", stream);
  if (nk <= 0 || nv % nk != 0 || dk <= 0 || dk > kDecodeMaxHeadDim || dv <= 0 || (dv + 31) / 32 > 65535)
    cuda_throw("gdn_decode_launch", "needs value heads a multiple of key heads, 0 < dk <= 512 and dv > 0",
               __FILE__, __LINE__);
  gdn_decode_slice_run(kernel, qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, state, states,
                       ld_states, saved, T, nk, nv, dk, dv, stream);
}

void gdn_prefill_recurrent_launch(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b,
                                  int64_t ld_b, const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out,
                                  const int32_t* cu, int num_seqs, int64_t T, int nk, int nv, int dk, int dv,
                                  cudaStream_t stream) {
  if (T == 0 || num_seqs == 0) return;
  gdn_recurrence_run(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, nullptr, nullptr, 0, cu,
                     num_seqs, T, 0, nk, nv, dk, dv, "gdn_prefill_recurrent_launch", stream);
}

}  // namespace df
