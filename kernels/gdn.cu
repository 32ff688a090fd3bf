// Gated DeltaNet chunked prefill (UT/WY form, chunk 64) in three kernels, zero state at each sequence start.
// Per chunk (γ = cumsum g, Γ_ij = e^(γ_i − γ_j)):
//   (I + strictly_lower(β K Kᵀ ⊙ Γ)) [U | W] = [β V | β e^γ K]     (intra: every chunk at once)
//   V' = U − W S;   S ← e^(γ_C) S + (K ⊙ e^(γ_C − γ))ᵀ V'          (state pass: sequential over chunks,
//                                                                    parallel over 32-column slices of dv)
//   O = (Q ⊙ e^γ) S + lower_incl(Q Kᵀ ⊙ Γ) V'                        (output: every chunk at once)
// One block per (sequence, value head) walking 64 chunks left 384 blocks on 132 SMs with a 64-step serial
// solve per chunk on the critical path; here only the thin state recurrence is sequential. W, U/V' and the
// per-chunk start states go through an fp32 global workspace (stream-ordered allocation). Gates, norms, the
// solve and every accumulator are fp32; the chunk products run on tensor cores in TF32 (operands rounded to
// 10 mantissa bits, fp32 accumulate: ~5e-4 relative, under the bf16 output's 4e-3). Row strides are padded
// so fragment loads are bank-conflict free: ≡ 4 (mod 32) floats for operands read along rows, ≡ 8 for
// operands read down columns. Head dims are zero-padded to 32/64/128.
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

constexpr int kGdnBV = 32;  // value columns per state-pass block

// 8 consecutive bf16 (16 bytes) of a row into fp32, or zeros.
__device__ __forceinline__ void gdn_load8(float* dst, const bf16* src, bool in) {
  uint4 v = in ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
  const bf16* e = reinterpret_cast<const bf16*>(&v);
#pragma unroll
  for (int j = 0; j < 8; ++j) dst[j] = __bfloat162float(e[j]);
}

// Rows [0, L) of n ≤ D bf16 columns starting at column `off` of the chunk's qkv rows into X [C][ld] as fp32;
// rows ≥ L and columns ≥ n are zero.
template <int D>
__device__ __forceinline__ void gdn_load_rows(float* X, int ld, const bf16* qkv, int64_t ld_qkv, int64_t t0, int L,
                                              int64_t off, int n) {
  for (int i = threadIdx.x; i < kGdnChunk * (D / 8); i += kGdnThreads) {
    int r = i / (D / 8), d = (i % (D / 8)) * 8;
    gdn_load8(X + r * ld + d, qkv + (t0 + r) * ld_qkv + off + d, r < L && d < n);
  }
}

// Each row of X [C][ld] (D columns) scaled to unit L2 norm (eps 1e-6 as FLA's l2norm), times `scale`.
template <int D>
__device__ __forceinline__ void gdn_l2norm_rows(float* X, int ld, float scale) {
  const int lane = threadIdx.x & 31;
  for (int r = threadIdx.x / 32; r < kGdnChunk; r += kGdnWarps) {
    float* row = X + r * ld;
    float ss = 0.0f;
    for (int d = lane; d < D; d += 32) ss += row[d] * row[d];
    float sc = rsqrtf(warp_sum(ss) + 1e-6f) * scale;
    for (int d = lane; d < D; d += 32) row[d] *= sc;
  }
}

// γ of the chunk's rows: global gam_g [T, nv] for rows < L; padded rows repeat γ_{L−1} (their g is 0).
__device__ __forceinline__ void gdn_load_gamma(float* gam, float* eg, const float* gam_g, int64_t t0, int L, int h,
                                               int nv) {
  if (threadIdx.x < kGdnChunk) {
    int r = min(static_cast<int>(threadIdx.x), L - 1);
    float g = gam_g[(t0 + r) * nv + h];
    gam[threadIdx.x] = g;
    eg[threadIdx.x] = expf(g);
  }
}

// The chunk of (sequence blockIdx.z, chunk blockIdx.x): first token and length; false past the sequence end.
__device__ __forceinline__ bool gdn_chunk(const int32_t* cu, int64_t& t0, int& L) {
  const int start = cu[blockIdx.z], len = cu[blockIdx.z + 1] - start, c0 = blockIdx.x * kGdnChunk;
  t0 = start + c0;
  L = min(kGdnChunk, len - c0);
  return c0 < len;
}

template <int D>
struct GdnIntraSmem {
  static constexpr int C = kGdnChunk, kLdRow = D + 4, kLdCol = D + 8, kLdA = C + 4;
  static constexpr int kK = 0, kW = kK + C * kLdRow, kU = kW + C * kLdRow, kA = kU + C * kLdCol, kGam = kA + C * kLdA,
                       kBeta = kGam + C, kEg = kBeta + C, kTotal = kEg + C;
};

// Intra-chunk: gates and their cumulative sum, the normalised keys, the triangular system and its solution
// [U | W] by forward substitution (one column per thread). Writes W [T, nv, D], U [T, nv, D], γ [T, nv].
template <int D>
__global__ void __launch_bounds__(kGdnThreads, 1)
    gdn_intra_kernel(const bf16* qkv, int64_t ld_qkv, const bf16* a_in, int64_t ld_a, const bf16* b_in, int64_t ld_b,
                     const float* A_log, const float* dt_bias, const int32_t* cu, int nk, int nv, int dk, int dv,
                     float* w_g, float* u_g, float* gam_g) {
  using L_ = GdnIntraSmem<D>;
  constexpr int C = kGdnChunk, LR = L_::kLdRow, LC = L_::kLdCol, LA = L_::kLdA;
  extern __shared__ __align__(16) float gdn_smem[];
  float* Kc = gdn_smem + L_::kK;  // [C][LR]
  float* W = gdn_smem + L_::kW;   // [C][LR]  β e^γ K, then W
  float* U = gdn_smem + L_::kU;   // [C][LC]  β V, then U
  float* A = gdn_smem + L_::kA;   // [C][LA]  the strictly lower system
  float* gam = gdn_smem + L_::kGam;
  float* beta = gdn_smem + L_::kBeta;
  float* eg = gdn_smem + L_::kEg;

  int64_t t0;
  int L;
  if (!gdn_chunk(cu, t0, L)) return;
  const int h = blockIdx.y, tid = threadIdx.x, lane = tid & 31;
  const int kh = h / (nv / nk);
  gdn_load_rows<D>(Kc, LR, qkv, ld_qkv, t0, L, (int64_t)nk * dk + (int64_t)kh * dk, dk);
  gdn_load_rows<D>(U, LC, qkv, ld_qkv, t0, L, 2LL * nk * dk + (int64_t)h * dv, dv);
  if (tid < C) {
    float g = 0.0f, bt = 0.0f;
    if (tid < L) {
      int64_t t = t0 + tid;
      float x = __bfloat162float(a_in[t * ld_a + h]) + dt_bias[h];
      float sp = x > 20.0f ? x : log1pf(expf(x));  // torch softplus, threshold 20
      g = -expf(A_log[h]) * sp;
      bt = sigmoid_f32(__bfloat162float(b_in[t * ld_b + h]));
    }
    gam[tid] = g;
    beta[tid] = bt;
  }
  __syncthreads();
  if (tid < 32) {  // γ = cumsum(g): two rows per lane, then a warp scan
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
  gdn_l2norm_rows<D>(Kc, LR, 1.0f);
  __syncthreads();

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

  for (int i = tid; i < L * (D / 4); i += kGdnThreads) {
    int r = i / (D / 4), d = (i % (D / 4)) * 4;
    int64_t g = ((t0 + r) * nv + h) * D + d;
    *reinterpret_cast<float4*>(w_g + g) = *reinterpret_cast<const float4*>(W + r * LR + d);
    *reinterpret_cast<float4*>(u_g + g) = *reinterpret_cast<const float4*>(U + r * LC + d);
  }
  if (tid < L) gam_g[(t0 + tid) * nv + h] = gam[tid];
}

template <int D>
struct GdnStateSmem {
  static constexpr int C = kGdnChunk, kLdRow = D + 4, kLdCol = kGdnBV + 8;
  static constexpr int kS = 0, kW = kS + D * kLdCol, kK = kW + C * kLdRow, kU = kK + C * kLdRow, kGam = kU + C * kLdCol,
                       kEg = kGam + C, kEk = kEg + C, kTotal = kEk + C;
};

// State pass for value columns [32·blockIdx.x, +32) of head blockIdx.y of sequence blockIdx.z: per chunk,
// saves the chunk's start state into states_g, turns U into V' = U − W S in place, then advances S.
template <int D>
__global__ void __launch_bounds__(kGdnThreads)
    gdn_state_kernel(const bf16* qkv, int64_t ld_qkv, const int32_t* cu, int nk, int nv, int dk, int max_chunks,
                     const float* w_g, float* u_g, const float* gam_g, float* states_g) {
  using L_ = GdnStateSmem<D>;
  constexpr int C = kGdnChunk, BV = kGdnBV, LR = L_::kLdRow, LS = L_::kLdCol;
  extern __shared__ __align__(16) float gdn_smem[];
  float* S = gdn_smem + L_::kS;   // [D][LS]  state slice
  float* W = gdn_smem + L_::kW;   // [C][LR]
  float* Kc = gdn_smem + L_::kK;  // [C][LR]
  float* U = gdn_smem + L_::kU;   // [C][LS]  U slice, then V'
  float* gam = gdn_smem + L_::kGam;
  float* eg = gdn_smem + L_::kEg;
  float* ek = gdn_smem + L_::kEk;

  const int j0 = blockIdx.x * BV, h = blockIdx.y, seq = blockIdx.z, tid = threadIdx.x;
  const int kh = h / (nv / nk);
  const int start = cu[seq], len = cu[seq + 1] - start;
  for (int i = tid; i < D * LS; i += kGdnThreads) S[i] = 0.0f;

  for (int c = 0; c * C < len; ++c) {
    const int64_t t0 = start + (int64_t)c * C;
    const int L = min(C, len - c * C);
    __syncthreads();  // the previous chunk's readers are done
    gdn_load_rows<D>(Kc, LR, qkv, ld_qkv, t0, L, (int64_t)nk * dk + (int64_t)kh * dk, dk);
    for (int i = tid; i < C * (D / 4); i += kGdnThreads) {
      int r = i / (D / 4), d = (i % (D / 4)) * 4;
      float4 v = r < L ? *reinterpret_cast<const float4*>(w_g + ((t0 + r) * nv + h) * D + d) : make_float4(0, 0, 0, 0);
      *reinterpret_cast<float4*>(W + r * LR + d) = v;
    }
    for (int i = tid; i < C * (BV / 4); i += kGdnThreads) {
      int r = i / (BV / 4), d = (i % (BV / 4)) * 4;
      float4 v = r < L ? *reinterpret_cast<const float4*>(u_g + ((t0 + r) * nv + h) * D + j0 + d)
                       : make_float4(0, 0, 0, 0);
      *reinterpret_cast<float4*>(U + r * LS + d) = v;
    }
    gdn_load_gamma(gam, eg, gam_g, t0, L, h, nv);
    // This chunk's start state, for the output kernel.
    float* st = states_g + (((int64_t)seq * max_chunks + c) * nv + h) * D * D + j0;
    for (int i = tid; i < D * (BV / 4); i += kGdnThreads) {
      int r = i / (BV / 4), d = (i % (BV / 4)) * 4;
      *reinterpret_cast<float4*>(st + (int64_t)r * D + d) = *reinterpret_cast<const float4*>(S + r * LS + d);
    }
    __syncthreads();
    gdn_l2norm_rows<D>(Kc, LR, 1.0f);
    if (tid < C) ek[tid] = expf(gam[C - 1] - gam[tid]);
    {  // V' = U − W S
      float acc[GdnTile<C, BV>::kNTiles][4];
      gdn_zero<C, BV>(acc);
      gdn_mma<C, BV, D>(acc, [&](int i, int k) { return W[i * LR + k]; }, [&](int k, int j) { return S[k * LS + j]; });
      gdn_store<C, BV>(acc, [&](int i, int j, float v) { U[i * LS + j] -= v; });
    }
    __syncthreads();
    for (int i = tid; i < L * (BV / 4); i += kGdnThreads) {
      int r = i / (BV / 4), d = (i % (BV / 4)) * 4;
      *reinterpret_cast<float4*>(u_g + ((t0 + r) * nv + h) * D + j0 + d) = *reinterpret_cast<const float4*>(U + r * LS + d);
    }
    {  // S = e^(γ_C) S + (K ⊙ e^(γ_C − γ))ᵀ V'; each thread rewrites only its own elements
      float acc[GdnTile<D, BV>::kNTiles][4];
      gdn_zero<D, BV>(acc);
      gdn_mma<D, BV, C>(acc, [&](int i, int k) { return Kc[k * LR + i] * ek[k]; },
                        [&](int k, int j) { return U[k * LS + j]; });
      const float decay = eg[C - 1];
      gdn_store<D, BV>(acc, [&](int i, int j, float v) { S[i * LS + j] = decay * S[i * LS + j] + v; });
    }
  }
}

template <int D>
struct GdnOutSmem {
  static constexpr int C = kGdnChunk, kLdRow = D + 4, kLdCol = D + 8, kLdA = C + 4;
  static constexpr int kS = 0, kQ = kS + D * kLdCol, kK = kQ + C * kLdRow, kV = kK + C * kLdRow, kA = kV + C * kLdCol,
                       kGam = kA + C * kLdA, kEg = kGam + C, kTotal = kEg + C;
};

// Output: O = (Q ⊙ e^γ) S_start + lower_incl(Q Kᵀ ⊙ Γ) V' for every chunk at once.
template <int D>
__global__ void __launch_bounds__(kGdnThreads, 1)
    gdn_output_kernel(const bf16* qkv, int64_t ld_qkv, const int32_t* cu, int nk, int nv, int dk, int dv,
                      int max_chunks, const float* u_g, const float* gam_g, const float* states_g, bf16* out,
                      int64_t ld_out) {
  using L_ = GdnOutSmem<D>;
  constexpr int C = kGdnChunk, LR = L_::kLdRow, LC = L_::kLdCol, LA = L_::kLdA;
  extern __shared__ __align__(16) float gdn_smem[];
  float* S = gdn_smem + L_::kS;   // [D][LC]
  float* Q = gdn_smem + L_::kQ;   // [C][LR]
  float* Kc = gdn_smem + L_::kK;  // [C][LR]
  float* V = gdn_smem + L_::kV;   // [C][LC]  V'
  float* A = gdn_smem + L_::kA;   // [C][LA]  masked Q Kᵀ ⊙ Γ
  float* gam = gdn_smem + L_::kGam;
  float* eg = gdn_smem + L_::kEg;

  int64_t t0;
  int L;
  if (!gdn_chunk(cu, t0, L)) return;
  const int h = blockIdx.y, tid = threadIdx.x;
  const int kh = h / (nv / nk);
  gdn_load_rows<D>(Q, LR, qkv, ld_qkv, t0, L, (int64_t)kh * dk, dk);
  gdn_load_rows<D>(Kc, LR, qkv, ld_qkv, t0, L, (int64_t)nk * dk + (int64_t)kh * dk, dk);
  for (int i = tid; i < C * (D / 4); i += kGdnThreads) {
    int r = i / (D / 4), d = (i % (D / 4)) * 4;
    float4 v = r < L ? *reinterpret_cast<const float4*>(u_g + ((t0 + r) * nv + h) * D + d) : make_float4(0, 0, 0, 0);
    *reinterpret_cast<float4*>(V + r * LC + d) = v;
  }
  const float* st = states_g + (((int64_t)blockIdx.z * max_chunks + blockIdx.x) * nv + h) * D * D;
  for (int i = tid; i < D * (D / 4); i += kGdnThreads) {
    int r = i / (D / 4), d = (i % (D / 4)) * 4;
    *reinterpret_cast<float4*>(S + r * LC + d) = *reinterpret_cast<const float4*>(st + (int64_t)r * D + d);
  }
  gdn_load_gamma(gam, eg, gam_g, t0, L, h, nv);
  __syncthreads();
  gdn_l2norm_rows<D>(Q, LR, rsqrtf(static_cast<float>(dk)));
  gdn_l2norm_rows<D>(Kc, LR, 1.0f);
  __syncthreads();
  {
    float acc[GdnTile<C, C>::kNTiles][4];
    gdn_zero<C, C>(acc);
    gdn_mma<C, C, D>(acc, [&](int i, int k) { return Q[i * LR + k]; }, [&](int k, int j) { return Kc[j * LR + k]; });
    gdn_store<C, C>(acc, [&](int i, int j, float v) { A[i * LA + j] = j <= i ? expf(gam[i] - gam[j]) * v : 0.0f; });
  }
  __syncthreads();
  {
    float acc[GdnTile<C, D>::kNTiles][4];
    gdn_zero<C, D>(acc);
    gdn_mma<C, D, D>(acc, [&](int i, int k) { return Q[i * LR + k] * eg[i]; },
                     [&](int k, int j) { return S[k * LC + j]; });
    gdn_mma<C, D, C>(acc, [&](int i, int k) { return A[i * LA + k]; }, [&](int k, int j) { return V[k * LC + j]; });
    bf16* orow = out + t0 * ld_out + (int64_t)h * dv;
    gdn_store<C, D>(acc, [&](int i, int j, float v) {
      if (i < L && j < dv) orow[(int64_t)i * ld_out + j] = __float2bfloat16(v);
    });
  }
}

// ---- launchers ----
template <class K>
static void gdn_set_smem(K kernel, size_t smem) {
  DF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

template <int D>
static void gdn_prefill_run(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b, int64_t ld_b,
                            const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out, const int32_t* cu,
                            int num_seqs, int64_t T, int max_len, int nk, int nv, int dk, int dv,
                            cudaStream_t stream) {
  const int max_chunks = (max_len + kGdnChunk - 1) / kGdnChunk;
  // W and U [T, nv, D], γ [T, nv] (rounded up to keep the states 16-byte aligned), start states per chunk.
  const size_t wu = size_t(T) * nv * D, gam = (size_t(T) * nv + 3) / 4 * 4;
  const size_t states = size_t(num_seqs) * max_chunks * nv * D * D;
  float* ws = nullptr;
  DF_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ws), sizeof(float) * (2 * wu + gam + states), stream));
  float *w_g = ws, *u_g = ws + wu, *gam_g = ws + 2 * wu, *states_g = gam_g + gam;

  const size_t s1 = sizeof(float) * GdnIntraSmem<D>::kTotal, s2 = sizeof(float) * GdnStateSmem<D>::kTotal,
               s3 = sizeof(float) * GdnOutSmem<D>::kTotal;
  gdn_set_smem(gdn_intra_kernel<D>, s1);
  gdn_set_smem(gdn_state_kernel<D>, s2);
  gdn_set_smem(gdn_output_kernel<D>, s3);
  const dim3 chunks(max_chunks, nv, num_seqs), slices(D / kGdnBV, nv, num_seqs);
  gdn_intra_kernel<D><<<chunks, kGdnThreads, s1, stream>>>(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, cu, nk, nv,
                                                           dk, dv, w_g, u_g, gam_g);
  DF_CUDA_CHECK_LAUNCH("gdn_intra_kernel");
  gdn_state_kernel<D><<<slices, kGdnThreads, s2, stream>>>(qkv, ld_qkv, cu, nk, nv, dk, max_chunks, w_g, u_g, gam_g,
                                                           states_g);
  DF_CUDA_CHECK_LAUNCH("gdn_state_kernel");
  gdn_output_kernel<D><<<chunks, kGdnThreads, s3, stream>>>(qkv, ld_qkv, cu, nk, nv, dk, dv, max_chunks, u_g, gam_g,
                                                            states_g, out, ld_out);
  DF_CUDA_CHECK_LAUNCH("gdn_output_kernel");
  DF_CUDA_CHECK(cudaFreeAsync(ws, stream));
}

void gdn_prefill_launch(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b, int64_t ld_b,
                        const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out, const int32_t* cu,
                        int num_seqs, int64_t T, int max_len, int nk, int nv, int dk, int dv, cudaStream_t stream) {
  if (num_seqs == 0 || nv == 0 || T == 0) return;
  bool ok = dk <= 128 && dv <= 128 && dk % 8 == 0 && dv % 8 == 0 && nk > 0 && nv % nk == 0 && ld_qkv % 8 == 0 &&
            reinterpret_cast<uintptr_t>(qkv) % 16 == 0;
  if (!ok)
    cuda_throw("gdn_prefill_launch",
               "needs key/value head dims multiples of 8 and <= 128, value heads a multiple of key heads, and a "
               "16-byte aligned qkv with a row stride that is a multiple of 8",
               __FILE__, __LINE__);
  int d = dk > dv ? dk : dv;
  if (d <= 32)
    gdn_prefill_run<32>(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, cu, num_seqs, T, max_len, nk, nv,
                        dk, dv, stream);
  else if (d <= 64)
    gdn_prefill_run<64>(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, cu, num_seqs, T, max_len, nk, nv,
                        dk, dv, stream);
  else
    gdn_prefill_run<128>(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, cu, num_seqs, T, max_len, nk, nv,
                         dk, dv, stream);
}

}  // namespace df
