// Gated DeltaNet chunked prefill (UT/WY form, chunk 64), fp32 throughout. One block per (value head,
// sequence) walks the sequence's chunks with the state S [dk, dv] resident in shared memory, starting from
// zero, so no state crosses a sequence boundary. Per chunk (γ = cumsum g, Γ_ij = e^(γ_i − γ_j)):
//   (I + strictly_lower(β K Kᵀ ⊙ Γ)) [U | W] = [β V | β e^γ K]     (forward substitution, one column/thread)
//   V' = U − W S;   O = (Q ⊙ e^γ) S + lower_incl(Q Kᵀ ⊙ Γ) V';   S = e^(γ_C) S + (K ⊙ e^(γ_C − γ))ᵀ V'
// This is the simple correct version: SIMT fp32 matmuls out of shared memory (rows padded by one float so
// row- and column-wise walks are both conflict free). Head dims are zero-padded to 32/64/128.
#include <cmath>

#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

constexpr int kGdnChunk = 64;
constexpr int kGdnThreads = 256;

// ---- kernels ----
// acc[a][b] += Σ_k fa(ty + 16a, k) · fb(k, tx + 16b) for the block's 16×16 thread grid.
template <int M, int N, int K, class FA, class FB>
__device__ __forceinline__ void gdn_mm(float (&acc)[M / 16][N / 16], FA fa, FB fb) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    float av[M / 16], bv[N / 16];
#pragma unroll
    for (int a = 0; a < M / 16; ++a) av[a] = fa(ty + 16 * a, k);
#pragma unroll
    for (int b = 0; b < N / 16; ++b) bv[b] = fb(k, tx + 16 * b);
#pragma unroll
    for (int a = 0; a < M / 16; ++a)
#pragma unroll
      for (int b = 0; b < N / 16; ++b) acc[a][b] += av[a] * bv[b];
  }
}

template <int M, int N>
__device__ __forceinline__ void gdn_zero(float (&acc)[M / 16][N / 16]) {
#pragma unroll
  for (int a = 0; a < M / 16; ++a)
#pragma unroll
    for (int b = 0; b < N / 16; ++b) acc[a][b] = 0.0f;
}

template <int D>
__global__ void __launch_bounds__(kGdnThreads, 1)
    gdn_prefill_kernel(const bf16* qkv, int64_t ld_qkv, const bf16* a_in, int64_t ld_a, const bf16* b_in,
                       int64_t ld_b, const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out,
                       const int32_t* cu, int nk, int nv, int dk, int dv) {
  constexpr int C = kGdnChunk, LD = D + 1, LDA = C + 1;
  extern __shared__ float gdn_smem[];
  float* S = gdn_smem;         // [D][LD]  state, key dim × value dim
  float* Q = S + D * LD;       // [C][LD]
  float* Kc = Q + C * LD;      // [C][LD]
  float* U = Kc + C * LD;      // [C][LD]  β V, then U, then V'
  float* W = U + C * LD;       // [C][LD]  β e^γ K, then W
  float* A = W + C * LD;       // [C][LDA] the strictly lower system, then the masked Q Kᵀ ⊙ Γ
  float* gam = A + C * LDA;    // [C] g, then its cumsum γ
  float* beta = gam + C;       // [C]
  float* eg = beta + C;        // [C] e^γ
  float* ek = eg + C;          // [C] e^(γ_C − γ)

  const int h = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
  const int kh = h / (nv / nk);
  const int start = cu[seq], len = cu[seq + 1] - start;
  const float neg_A = -expf(A_log[h]), dtb = dt_bias[h];
  const float q_scale = rsqrtf(static_cast<float>(dk));
  const int64_t q_off = (int64_t)kh * dk, k_off = (int64_t)nk * dk + kh * dk, v_off = 2LL * nk * dk + (int64_t)h * dv;
  const int tx = tid % 16, ty = tid / 16;

  for (int i = tid; i < D * LD; i += kGdnThreads) S[i] = 0.0f;

  for (int c0 = 0; c0 < len; c0 += C) {
    const int L = min(C, len - c0);
    __syncthreads();  // previous chunk's readers of Q/K/U/A are done
    for (int i = tid; i < C * D; i += kGdnThreads) {
      int r = i / D, d = i % D;
      const bf16* row = qkv + (int64_t)(start + c0 + r) * ld_qkv;
      bool in = r < L;
      Q[r * LD + d] = in && d < dk ? __bfloat162float(row[q_off + d]) : 0.0f;
      Kc[r * LD + d] = in && d < dk ? __bfloat162float(row[k_off + d]) : 0.0f;
      U[r * LD + d] = in && d < dv ? __bfloat162float(row[v_off + d]) : 0.0f;
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

    // l2norm of q (then · dk^−½) and k rows, one warp per row.
    for (int task = tid / 32; task < 2 * C; task += kGdnThreads / 32) {
      float* row = (task < C ? Q : Kc) + (task % C) * LD;
      float ss = 0.0f;
      for (int d = tid & 31; d < D; d += 32) ss += row[d] * row[d];
      float sc = rsqrtf(warp_sum(ss) + 1e-6f) * (task < C ? q_scale : 1.0f);
      for (int d = tid & 31; d < D; d += 32) row[d] *= sc;
    }
    if (tid == 0) {
      float acc = 0.0f;
      for (int r = 0; r < C; ++r) {
        acc += gam[r];
        gam[r] = acc;
        eg[r] = expf(acc);
      }
    }
    __syncthreads();

    // Right-hand sides and the strictly lower system matrix.
    for (int i = tid; i < C * D; i += kGdnThreads) {
      int r = i / D, d = i % D;
      U[r * LD + d] *= beta[r];
      W[r * LD + d] = beta[r] * eg[r] * Kc[r * LD + d];
    }
    {
      float acc[C / 16][C / 16];
      gdn_zero<C, C>(acc);
      gdn_mm<C, C, D>(acc, [&](int i, int k) { return Kc[i * LD + k]; }, [&](int k, int j) { return Kc[j * LD + k]; });
#pragma unroll
      for (int a = 0; a < C / 16; ++a)
#pragma unroll
        for (int b = 0; b < C / 16; ++b) {
          int i = ty + 16 * a, j = tx + 16 * b;
          A[i * LDA + j] = j < i ? beta[i] * expf(gam[i] - gam[j]) * acc[a][b] : 0.0f;
        }
    }
    __syncthreads();

    // Forward substitution: each thread owns one column of [U | W], so rows need no barrier between them.
    if (tid < 2 * D) {
      float* X = (tid < D ? U : W) + (tid % D);
      for (int i = 1; i < L; ++i) {
        float acc = X[i * LD];
        const float* Ai = A + i * LDA;
        for (int j = 0; j < i; ++j) acc -= Ai[j] * X[j * LD];
        X[i * LD] = acc;
      }
    }
    __syncthreads();

    // V' = U − W S (in U), and the masked intra-chunk scores Q Kᵀ ⊙ Γ (in A).
    {
      float acc[C / 16][D / 16];
      gdn_zero<C, D>(acc);
      gdn_mm<C, D, D>(acc, [&](int i, int k) { return W[i * LD + k]; }, [&](int k, int j) { return S[k * LD + j]; });
#pragma unroll
      for (int a = 0; a < C / 16; ++a)
#pragma unroll
        for (int b = 0; b < D / 16; ++b) U[(ty + 16 * a) * LD + tx + 16 * b] -= acc[a][b];
    }
    {
      float acc[C / 16][C / 16];
      gdn_zero<C, C>(acc);
      gdn_mm<C, C, D>(acc, [&](int i, int k) { return Q[i * LD + k]; }, [&](int k, int j) { return Kc[j * LD + k]; });
#pragma unroll
      for (int a = 0; a < C / 16; ++a)
#pragma unroll
        for (int b = 0; b < C / 16; ++b) {
          int i = ty + 16 * a, j = tx + 16 * b;
          A[i * LDA + j] = j <= i ? expf(gam[i] - gam[j]) * acc[a][b] : 0.0f;
        }
    }
    if (tid < C) ek[tid] = expf(gam[C - 1] - gam[tid]);
    __syncthreads();

    // O = (Q ⊙ e^γ) S + A V'.
    {
      float acc[C / 16][D / 16];
      gdn_zero<C, D>(acc);
      gdn_mm<C, D, D>(acc, [&](int i, int k) { return Q[i * LD + k] * eg[i]; },
                      [&](int k, int j) { return S[k * LD + j]; });
      gdn_mm<C, D, C>(acc, [&](int i, int k) { return A[i * LDA + k]; }, [&](int k, int j) { return U[k * LD + j]; });
#pragma unroll
      for (int a = 0; a < C / 16; ++a)
#pragma unroll
        for (int b = 0; b < D / 16; ++b) {
          int i = ty + 16 * a, j = tx + 16 * b;
          if (i < L && j < dv) out[(int64_t)(start + c0 + i) * ld_out + (int64_t)h * dv + j] = __float2bfloat16(acc[a][b]);
        }
    }
    __syncthreads();  // every reader of the old S is done

    // S = e^(γ_C) S + (K ⊙ e^(γ_C − γ))ᵀ V'; each thread rewrites only its own elements.
    {
      float acc[D / 16][D / 16];
      gdn_zero<D, D>(acc);
      gdn_mm<D, D, C>(acc, [&](int i, int k) { return Kc[k * LD + i] * ek[k]; },
                      [&](int k, int j) { return U[k * LD + j]; });
      const float decay = eg[C - 1];
#pragma unroll
      for (int a = 0; a < D / 16; ++a)
#pragma unroll
        for (int b = 0; b < D / 16; ++b) {
          float* s = S + (ty + 16 * a) * LD + tx + 16 * b;
          *s = decay * *s + acc[a][b];
        }
    }
  }
}

// ---- launchers ----
template <int D>
static void gdn_prefill_run(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b, int64_t ld_b,
                            const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out, const int32_t* cu,
                            int num_seqs, int nk, int nv, int dk, int dv, cudaStream_t stream) {
  constexpr int C = kGdnChunk;
  size_t smem = sizeof(float) * ((size_t)D * (D + 1) + 4 * (size_t)C * (D + 1) + (size_t)C * (C + 1) + 4 * C);
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
  if (dk > 128 || dv > 128 || nk <= 0 || nv % nk != 0)
    cuda_throw("gdn_prefill_launch", "needs key/value head dims <= 128 and value heads a multiple of key heads",
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
