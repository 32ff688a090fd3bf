// Gated DeltaNet chunked prefill (UT/WY form, chunk 64). One block per (value head, sequence) walks the
// sequence's chunks with the state S [dk, dv] resident in shared memory in fp32, starting from zero, so no
// state crosses a sequence boundary. Per chunk (γ = cumsum g, Γ_ij = e^(γ_i − γ_j)):
//   (I + strictly_lower(β K Kᵀ ⊙ Γ)) [U | W] = [β V | β e^γ K]     (forward substitution, one column/thread)
//   V' = U − W S;   O = (Q ⊙ e^γ) S + lower_incl(Q Kᵀ ⊙ Γ) V';   S = e^(γ_C) S + (K ⊙ e^(γ_C − γ))ᵀ V'
// Gates, norms, the solve and every accumulator are fp32; the six chunk products run on tensor cores in
// TF32 (operands rounded to 10 mantissa bits, fp32 accumulate: ~5e-4 relative, under the bf16 output's
// 4e-3). Row strides are padded so fragment loads are bank-conflict free: ≡ 4 (mod 32) floats for operands
// read along rows, ≡ 8 for operands read down columns. Head dims are zero-padded to 32/64/128.
#include <cmath>

#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"
#include "kernels/mma.cuh"

namespace df {

constexpr int kGdnChunk = 64;
constexpr int kGdnThreads = 256;
constexpr int kGdnWarps = kGdnThreads / 32;

// ---- kernels ----
// Warp tiling of an M×N product over the 8 warps: M/16 row strips, each split across the remaining warps.
template <int M, int N>
struct GdnTile {
  static constexpr int kStrips = M / 16;
  static constexpr int kWarpsPerStrip = kGdnWarps / kStrips;
  static constexpr int kNTiles = N / 8 / kWarpsPerStrip;  // 8-column tiles per warp
  static_assert(kStrips <= kGdnWarps && kNTiles >= 1, "tile shape");
  __device__ static int row0() { return (threadIdx.x / 32) / kWarpsPerStrip * 16; }
  __device__ static int col0() { return (threadIdx.x / 32) % kWarpsPerStrip * kNTiles * 8; }
};

// acc += Σ_k fa(i, k) · fb(k, j) over this warp's tiles; fa/fb read fp32 from shared memory.
template <int M, int N, int K, class FA, class FB>
__device__ __forceinline__ void gdn_mma(float (&acc)[GdnTile<M, N>::kNTiles][4], FA fa, FB fb) {
  using Tl = GdnTile<M, N>;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int r0 = Tl::row0(), c0 = Tl::col0();
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 8) {
    uint32_t a0 = to_tf32(fa(r0 + g, k0 + t)), a1 = to_tf32(fa(r0 + g + 8, k0 + t));
    uint32_t a2 = to_tf32(fa(r0 + g, k0 + t + 4)), a3 = to_tf32(fa(r0 + g + 8, k0 + t + 4));
#pragma unroll
    for (int n = 0; n < Tl::kNTiles; ++n) {
      int col = c0 + n * 8 + g;
      mma_tf32_1688(acc[n], a0, a1, a2, a3, to_tf32(fb(k0 + t, col)), to_tf32(fb(k0 + t + 4, col)));
    }
  }
}

template <int M, int N>
__device__ __forceinline__ void gdn_zero(float (&acc)[GdnTile<M, N>::kNTiles][4]) {
#pragma unroll
  for (int n = 0; n < GdnTile<M, N>::kNTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// epi(i, j, value) for every element this thread holds; each element belongs to exactly one thread.
template <int M, int N, class F>
__device__ __forceinline__ void gdn_store(const float (&acc)[GdnTile<M, N>::kNTiles][4], F epi) {
  using Tl = GdnTile<M, N>;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int r0 = Tl::row0(), c0 = Tl::col0();
#pragma unroll
  for (int n = 0; n < Tl::kNTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) epi(r0 + g + (e >> 1) * 8, c0 + n * 8 + 2 * t + (e & 1), acc[n][e]);
}

// Shared-memory layout (floats) for padded head dim D; row strides as explained at the top.
template <int D>
struct GdnSmem {
  static constexpr int C = kGdnChunk;
  static constexpr int kLdRow = D + 4;  // Q, K, W: read along rows
  static constexpr int kLdCol = D + 8;  // S, U: read down columns
  static constexpr int kLdA = C + 4;
  static constexpr int kS = 0, kQ = kS + D * kLdCol, kK = kQ + C * kLdRow, kW = kK + C * kLdRow,
                       kU = kW + C * kLdRow, kA = kU + C * kLdCol, kGam = kA + C * kLdA, kBeta = kGam + C,
                       kEg = kBeta + C, kEk = kEg + C, kTotal = kEk + C;
};

// 8 consecutive bf16 (16 bytes) of a row into fp32, or zeros.
__device__ __forceinline__ void gdn_load8(float* dst, const bf16* src, bool in) {
  uint4 v = in ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
  const bf16* e = reinterpret_cast<const bf16*>(&v);
#pragma unroll
  for (int j = 0; j < 8; ++j) dst[j] = __bfloat162float(e[j]);
}

template <int D>
__global__ void __launch_bounds__(kGdnThreads, 1)
    gdn_prefill_kernel(const bf16* qkv, int64_t ld_qkv, const bf16* a_in, int64_t ld_a, const bf16* b_in,
                       int64_t ld_b, const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out,
                       const int32_t* cu, int nk, int nv, int dk, int dv) {
  using L_ = GdnSmem<D>;
  constexpr int C = kGdnChunk, LR = L_::kLdRow, LC = L_::kLdCol, LA = L_::kLdA;
  extern __shared__ __align__(16) float gdn_smem[];
  float* S = gdn_smem + L_::kS;  // [D][LC]  state, key dim × value dim
  float* Q = gdn_smem + L_::kQ;  // [C][LR]
  float* Kc = gdn_smem + L_::kK; // [C][LR]
  float* W = gdn_smem + L_::kW;  // [C][LR]  β e^γ K, then W
  float* U = gdn_smem + L_::kU;  // [C][LC]  β V, then U, then V'
  float* A = gdn_smem + L_::kA;  // [C][LA]  the strictly lower system, then the masked Q Kᵀ ⊙ Γ
  float* gam = gdn_smem + L_::kGam;
  float* beta = gdn_smem + L_::kBeta;
  float* eg = gdn_smem + L_::kEg;  // e^γ
  float* ek = gdn_smem + L_::kEk;  // e^(γ_C − γ)

  const int h = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x, lane = tid & 31;
  const int kh = h / (nv / nk);
  const int start = cu[seq], len = cu[seq + 1] - start;
  const float neg_A = -expf(A_log[h]), dtb = dt_bias[h];
  const float q_scale = rsqrtf(static_cast<float>(dk));
  const int64_t q_off = (int64_t)kh * dk, k_off = (int64_t)nk * dk + kh * dk, v_off = 2LL * nk * dk + (int64_t)h * dv;

  for (int i = tid; i < D * LC; i += kGdnThreads) S[i] = 0.0f;

  for (int c0 = 0; c0 < len; c0 += C) {
    const int L = min(C, len - c0);
    __syncthreads();  // the previous chunk's readers of Q/K/U/A are done
    for (int i = tid; i < C * (D / 8); i += kGdnThreads) {
      int r = i / (D / 8), d = (i % (D / 8)) * 8;
      const bf16* row = qkv + (int64_t)(start + c0 + r) * ld_qkv;
      bool in = r < L;
      gdn_load8(Q + r * LR + d, row + q_off + d, in && d < dk);
      gdn_load8(Kc + r * LR + d, row + k_off + d, in && d < dk);
      gdn_load8(U + r * LC + d, row + v_off + d, in && d < dv);
    }
    if (tid < C) {
      float g = 0.0f, bt = 0.0f;
      if (tid < L) {
        int64_t t = start + c0 + tid;
        float x = __bfloat162float(a_in[t * ld_a + h]) + dtb;
        float sp = x > 20.0f ? x : log1pf(expf(x));  // torch softplus, threshold 20
        g = neg_A * sp;
        bt = sigmoid_f32(__bfloat162float(b_in[t * ld_b + h]));
      }
      gam[tid] = g;
      beta[tid] = bt;
    }
    __syncthreads();

    // l2norm of q (then · dk^−½) and k rows, one warp per row; warp 0 first scans γ = cumsum(g).
    if (tid < 32) {
      float v0 = gam[2 * lane], v1 = gam[2 * lane + 1], s = v0 + v1, incl = s;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        float up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
      }
      float g0 = incl - s + v0, g1 = incl;
      gam[2 * lane] = g0;
      gam[2 * lane + 1] = g1;
      eg[2 * lane] = expf(g0);
      eg[2 * lane + 1] = expf(g1);
    }
    for (int task = tid / 32; task < 2 * C; task += kGdnWarps) {
      float* row = (task < C ? Q : Kc) + (task % C) * LR;
      float ss = 0.0f;
      for (int d = lane; d < D; d += 32) ss += row[d] * row[d];
      float sc = rsqrtf(warp_sum(ss) + 1e-6f) * (task < C ? q_scale : 1.0f);
      for (int d = lane; d < D; d += 32) row[d] *= sc;
    }
    __syncthreads();

    // Right-hand sides and the strictly lower system matrix.
    for (int i = tid; i < C * D; i += kGdnThreads) {
      int r = i / D, d = i % D;
      U[r * LC + d] *= beta[r];
      W[r * LR + d] = beta[r] * eg[r] * Kc[r * LR + d];
    }
    {
      float acc[GdnTile<C, C>::kNTiles][4];
      gdn_zero<C, C>(acc);
      gdn_mma<C, C, D>(acc, [&](int i, int k) { return Kc[i * LR + k]; }, [&](int k, int j) { return Kc[j * LR + k]; });
      gdn_store<C, C>(acc, [&](int i, int j, float v) {
        A[i * LA + j] = j < i ? beta[i] * expf(gam[i] - gam[j]) * v : 0.0f;
      });
    }
    __syncthreads();

    // Forward substitution: each thread owns one column of [U | W], so rows need no barrier between them.
    if (tid < 2 * D) {
      float* X = tid < D ? U + tid : W + (tid - D);
      const int ld = tid < D ? LC : LR;
      for (int i = 1; i < L; ++i) {
        const float* Ai = A + i * LA;
        float acc0 = X[i * ld], acc1 = 0.0f;
        int j = 0;
        for (; j + 4 <= i; j += 4) {
          float4 a4 = *reinterpret_cast<const float4*>(Ai + j);
          acc0 -= a4.x * X[j * ld] + a4.z * X[(j + 2) * ld];
          acc1 += a4.y * X[(j + 1) * ld] + a4.w * X[(j + 3) * ld];
        }
        for (; j < i; ++j) acc0 -= Ai[j] * X[j * ld];
        X[i * ld] = acc0 - acc1;
      }
    }
    __syncthreads();

    // V' = U − W S (in U), and the masked intra-chunk scores Q Kᵀ ⊙ Γ (in A).
    {
      float acc[GdnTile<C, D>::kNTiles][4];
      gdn_zero<C, D>(acc);
      gdn_mma<C, D, D>(acc, [&](int i, int k) { return W[i * LR + k]; }, [&](int k, int j) { return S[k * LC + j]; });
      gdn_store<C, D>(acc, [&](int i, int j, float v) { U[i * LC + j] -= v; });
    }
    {
      float acc[GdnTile<C, C>::kNTiles][4];
      gdn_zero<C, C>(acc);
      gdn_mma<C, C, D>(acc, [&](int i, int k) { return Q[i * LR + k]; }, [&](int k, int j) { return Kc[j * LR + k]; });
      gdn_store<C, C>(acc, [&](int i, int j, float v) { A[i * LA + j] = j <= i ? expf(gam[i] - gam[j]) * v : 0.0f; });
    }
    if (tid < C) ek[tid] = expf(gam[C - 1] - gam[tid]);
    __syncthreads();

    // O = (Q ⊙ e^γ) S + A V'.
    {
      float acc[GdnTile<C, D>::kNTiles][4];
      gdn_zero<C, D>(acc);
      gdn_mma<C, D, D>(acc, [&](int i, int k) { return Q[i * LR + k] * eg[i]; },
                       [&](int k, int j) { return S[k * LC + j]; });
      gdn_mma<C, D, C>(acc, [&](int i, int k) { return A[i * LA + k]; }, [&](int k, int j) { return U[k * LC + j]; });
      bf16* orow = out + (int64_t)(start + c0) * ld_out + (int64_t)h * dv;
      gdn_store<C, D>(acc, [&](int i, int j, float v) {
        if (i < L && j < dv) orow[(int64_t)i * ld_out + j] = __float2bfloat16(v);
      });
    }
    __syncthreads();  // every reader of the old S is done

    // S = e^(γ_C) S + (K ⊙ e^(γ_C − γ))ᵀ V'; each thread rewrites only its own elements.
    {
      float acc[GdnTile<D, D>::kNTiles][4];
      gdn_zero<D, D>(acc);
      gdn_mma<D, D, C>(acc, [&](int i, int k) { return Kc[k * LR + i] * ek[k]; },
                       [&](int k, int j) { return U[k * LC + j]; });
      const float decay = eg[C - 1];
      gdn_store<D, D>(acc, [&](int i, int j, float v) { S[i * LC + j] = decay * S[i * LC + j] + v; });
    }
  }
}

// ---- launchers ----
template <int D>
static void gdn_prefill_run(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b, int64_t ld_b,
                            const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out, const int32_t* cu,
                            int num_seqs, int nk, int nv, int dk, int dv, cudaStream_t stream) {
  size_t smem = sizeof(float) * GdnSmem<D>::kTotal;
  DF_CUDA_CHECK(cudaFuncSetAttribute(gdn_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  dim3 grid(nv, num_seqs);
  gdn_prefill_kernel<D><<<grid, kGdnThreads, smem, stream>>>(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out,
                                                             ld_out, cu, nk, nv, dk, dv);
  DF_CUDA_CHECK_LAUNCH("gdn_prefill_kernel");
}

void gdn_prefill_launch(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b, int64_t ld_b,
                        const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out, const int32_t* cu,
                        int num_seqs, int nk, int nv, int dk, int dv, cudaStream_t stream) {
  if (num_seqs == 0 || nv == 0) return;
  bool ok = dk <= 128 && dv <= 128 && dk % 8 == 0 && dv % 8 == 0 && nk > 0 && nv % nk == 0 && ld_qkv % 8 == 0 &&
            reinterpret_cast<uintptr_t>(qkv) % 16 == 0;
  if (!ok)
    cuda_throw("gdn_prefill_launch",
               "needs key/value head dims multiples of 8 and <= 128, value heads a multiple of key heads, and a "
               "16-byte aligned qkv with a row stride that is a multiple of 8",
               __FILE__, __LINE__);
  int d = dk > dv ? dk : dv;
  if (d <= 32)
    gdn_prefill_run<32>(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, cu, num_seqs, nk, nv, dk, dv, stream);
  else if (d <= 64)
    gdn_prefill_run<64>(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, cu, num_seqs, nk, nv, dk, dv, stream);
  else
    gdn_prefill_run<128>(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, cu, num_seqs, nk, nv, dk, dv,
                         stream);
}

}  // namespace df
