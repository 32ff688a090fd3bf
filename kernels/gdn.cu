// Gated DeltaNet chunked prefill (UT/WY form, chunk 64) in two kernels, so the sequential part is short.
// Per chunk (γ = cumsum g, Γ_ij = e^(γ_i − γ_j), A = strictly_lower(β K Kᵀ ⊙ Γ), T = (I + A)⁻¹):
//   W = T (β e^γ K),  U = T (β V),  V' = U − W S,  O = (Q ⊙ e^γ) S + lower_incl(Q Kᵀ ⊙ Γ) V',
//   S = e^(γ_C) S + (K ⊙ e^(γ_C − γ))ᵀ V'.
// gdn_chunk_kernel does everything that does not depend on S for every (chunk, value head) at once (T by
// 16×16 diagonal blocks and block rows of off-diagonal products) and leaves W, U and the masked scores as
// bf16 rows of a workspace indexed by token. gdn_state_kernel then walks each sequence per (value head,
// 32-column slice of dv) with that slice of S in fp32 from a zero start, so no state crosses a sequence
// boundary. Gates, norms, T and S stay fp32; the products take TF32 operands (exact for the bf16 ones)
// with fp32 accumulation. Row strides are padded so fragment loads are bank-conflict free.
#include <cmath>

#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"
#include "kernels/mma.cuh"

namespace df {

constexpr int kGdnChunk = 64;
constexpr int kGdnSlice = 32;  // value columns of S per state-pass block
constexpr int kGdnChunkThreads = 256;
constexpr int kGdnStateThreads = 128;  // one warp per 16 chunk rows

// ---- kernels ----
__device__ __forceinline__ float gdn_bf(bf16 x) { return __bfloat162float(x); }

// acc (this warp's 16 × 8·NT tile at rows r0, columns c0) += Σ_{k < K} fa(i, k) · fb(k, j).
template <int NT, int K, class FA, class FB>
__device__ __forceinline__ void gdn_warp_mma(float (&acc)[NT][4], int r0, int c0, FA fa, FB fb) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 8) {
    uint32_t a0 = to_tf32(fa(r0 + g, k0 + t)), a1 = to_tf32(fa(r0 + g + 8, k0 + t));
    uint32_t a2 = to_tf32(fa(r0 + g, k0 + t + 4)), a3 = to_tf32(fa(r0 + g + 8, k0 + t + 4));
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      int col = c0 + n * 8 + g;
      mma_tf32_1688(acc[n], a0, a1, a2, a3, to_tf32(fb(k0 + t, col)), to_tf32(fb(k0 + t + 4, col)));
    }
  }
}

template <int NT>
__device__ __forceinline__ void gdn_warp_zero(float (&acc)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// epi(i, j, v_j, v_j+1) for each pair of adjacent columns this lane holds (every element in one lane).
template <int NT, class F>
__device__ __forceinline__ void gdn_warp_store(const float (&acc)[NT][4], int r0, int c0, F epi) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    epi(r0 + g, c0 + n * 8 + 2 * t, acc[n][0], acc[n][1]);
    epi(r0 + g + 8, c0 + n * 8 + 2 * t, acc[n][2], acc[n][3]);
  }
}

// Rows [0, L) of the first n (a multiple of 8) bf16 columns of src (row stride ld) into X [64][ldx];
// the other rows and the columns [n, D) are zero. Asynchronous (cp.async, 16 bytes each, zero-filled where
// out of range) so every copy of a tile is in flight at once; gdn_stage_wait completes them.
template <int D, int NTHR>
__device__ __forceinline__ void gdn_stage(bf16* X, int ldx, const bf16* src, int64_t ld, int L, int n) {
  for (int i = threadIdx.x; i < kGdnChunk * (D / 8); i += NTHR) {
    int r = i / (D / 8), d = (i % (D / 8)) * 8;
    bool in = r < L && d < n;
    uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(X + r * ldx + d));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(in ? src + r * ld + d : src),
                 "r"(in ? 16 : 0));
  }
}

__device__ __forceinline__ void gdn_stage_wait() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

template <int D>
struct GdnChunkSmem {
  static constexpr int C = kGdnChunk, kLdB = D + 8, kLdA = C + 4, kLdX = 17;
  static constexpr size_t kBytes = 3 * sizeof(bf16) * C * kLdB + sizeof(float) * (C * kLdA + 3 * 16 * kLdX + 5 * C);
};

template <int D>
__global__ void __launch_bounds__(kGdnChunkThreads, 3)
    gdn_chunk_kernel(const bf16* qkv, int64_t ld_qkv, const bf16* a_in, int64_t ld_a, const bf16* b_in, int64_t ld_b,
                     const float* A_log, const float* dt_bias, const int32_t* cu, int nk, int nv, int dk, int dv,
                     bf16* ws_w, bf16* ws_u, bf16* ws_p, float4* ws_s) {
  using Sm = GdnChunkSmem<D>;
  constexpr int C = kGdnChunk, LB = Sm::kLdB, LA = Sm::kLdA, LX = Sm::kLdX;
  extern __shared__ __align__(16) unsigned char gdn_chunk_smem[];
  bf16* Qs = reinterpret_cast<bf16*>(gdn_chunk_smem);  // [C][LB] raw q, k, v rows
  bf16* Ks = Qs + C * LB;
  bf16* Vs = Ks + C * LB;
  // [C][LA]: A strictly below the diagonal; T stored transposed (T_ij at [j][i]) on and above it.
  float* Am = reinterpret_cast<float*>(Vs + C * LB);
  float* X = Am + C * LA;  // [3][16][LX] partial off-diagonal blocks of T
  float* gam = X + 3 * 16 * LX;
  float* beta = gam + C;
  float* qn = beta + C;  // dk^−½ / ‖q‖
  float* kn = qn + C;    // 1 / ‖k‖
  float* sw = kn + C;    // β e^γ / ‖k‖

  const int seq = blockIdx.x, h = blockIdx.z, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int len = cu[seq + 1] - cu[seq], c0 = blockIdx.y * C;
  if (c0 >= len) return;
  const int64_t t0 = cu[seq] + c0;
  const int L = min(C, len - c0), kh = h / (nv / nk);
  const bf16* row0 = qkv + t0 * ld_qkv;
  gdn_stage<D, kGdnChunkThreads>(Qs, LB, row0 + (int64_t)kh * dk, ld_qkv, L, dk);
  gdn_stage<D, kGdnChunkThreads>(Ks, LB, row0 + (int64_t)nk * dk + kh * dk, ld_qkv, L, dk);
  gdn_stage<D, kGdnChunkThreads>(Vs, LB, row0 + 2LL * nk * dk + (int64_t)h * dv, ld_qkv, L, dv);
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
  gdn_stage_wait();
  __syncthreads();

  // γ = cumsum(g) (warp 0, two rows per lane), and the inverse row norms of q and k (one warp per row).
  if (warp == 0) {
    float v0 = gam[2 * lane], v1 = gam[2 * lane + 1], s = v0 + v1, incl = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      float up = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += up;
    }
    gam[2 * lane] = incl - s + v0;
    gam[2 * lane + 1] = incl;
  }
  const float q_scale = rsqrtf(static_cast<float>(dk));
  for (int task = warp; task < 2 * C; task += kGdnChunkThreads / 32) {
    const bf16* row = (task < C ? Qs : Ks) + (task % C) * LB;
    float ss = 0.0f;
    for (int d = lane; d < D; d += 32) ss += gdn_bf(row[d]) * gdn_bf(row[d]);
    float inv = rsqrtf(warp_sum(ss) + 1e-6f);
    if (lane == 0) (task < C ? qn : kn)[task % C] = task < C ? inv * q_scale : inv;
  }
  __syncthreads();
  if (tid < C) sw[tid] = beta[tid] * expf(gam[tid]) * kn[tid];

  // A (into Am) and the masked scores lower_incl(Q Kᵀ ⊙ Γ) (straight to the workspace); warp → 16 × 32 tile.
  {
    const int r0 = (warp >> 1) * 16, cc = (warp & 1) * 32;
    float acc[4][4];
    gdn_warp_zero(acc);
    gdn_warp_mma<4, D>(acc, r0, cc, [&](int i, int k) { return gdn_bf(Ks[i * LB + k]); },
                       [&](int k, int j) { return gdn_bf(Ks[j * LB + k]); });
    auto a_of = [&](int i, int j, float v) {
      return j < i ? beta[i] * kn[i] * kn[j] * expf(gam[i] - gam[j]) * v : 0.0f;
    };
    gdn_warp_store(acc, r0, cc, [&](int i, int j, float v0, float v1) {
      if (j < i) Am[i * LA + j] = a_of(i, j, v0);
      if (j + 1 < i) Am[i * LA + j + 1] = a_of(i, j + 1, v1);
    });
    gdn_warp_zero(acc);
    gdn_warp_mma<4, D>(acc, r0, cc, [&](int i, int k) { return gdn_bf(Qs[i * LB + k]); },
                       [&](int k, int j) { return gdn_bf(Ks[j * LB + k]); });
    auto p_of = [&](int i, int j, float v) { return j <= i ? qn[i] * kn[j] * expf(gam[i] - gam[j]) * v : 0.0f; };
    gdn_warp_store(acc, r0, cc, [&](int i, int j, float v0, float v1) {
      if (i < L)
        *reinterpret_cast<uint32_t*>(ws_p + ((t0 + i) * nv + h) * C + j) = pack_bf16x2(p_of(i, j, v0), p_of(i, j + 1, v1));
    });
  }
  __syncthreads();

  // T = (I + A)⁻¹. Diagonal 16×16 blocks: forward substitution, one column per thread in registers.
  auto A_at = [&](int i, int j) { return Am[i * LA + j]; };     // i > j
  auto T_at = [&](int i, int j) { return Am[j * LA + i]; };     // i ≥ j
  if (tid < C) {
    const int base = (tid >> 4) * 16, c = tid & 15;
    float x[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      float s = r == c ? 1.0f : 0.0f;
#pragma unroll
      for (int m = 0; m < r; ++m) s -= A_at(base + r, base + m) * x[m];
      x[r] = s;
    }
#pragma unroll
    for (int r = 0; r < 16; ++r)
      if (r >= c) Am[(base + c) * LA + base + r] = x[r];
  }
  __syncthreads();
  // Block row bi: T_bi,bj = −T_bi,bi · Σ_{bj ≤ bm < bi} A_bi,bm T_bm,bj, from the block rows above it.
  for (int bi = 1; bi < 4; ++bi) {
    for (int e = tid; e < bi * 256; e += kGdnChunkThreads) {
      const int bj = e >> 8, r = (e >> 4) & 15, c = e & 15, col = bj * 16 + c, row = bi * 16 + r;
      float s = 0.0f;
      for (int k = c; k < 16; ++k) s += A_at(row, bj * 16 + k) * T_at(bj * 16 + k, col);
      for (int m = bj * 16 + 16; m < bi * 16; ++m) s += A_at(row, m) * T_at(m, col);
      X[(bj * 16 + r) * LX + c] = s;
    }
    __syncthreads();
    for (int e = tid; e < bi * 256; e += kGdnChunkThreads) {
      const int bj = e >> 8, r = (e >> 4) & 15, c = e & 15;
      float s = 0.0f;
      for (int k = 0; k <= r; ++k) s += T_at(bi * 16 + r, bi * 16 + k) * X[(bj * 16 + k) * LX + c];
      Am[(bj * 16 + c) * LA + bi * 16 + r] = -s;
    }
    __syncthreads();
  }

  // W = T (β e^γ K̂), U = T (β V): 16 warp tasks of 16 rows × D/2 columns, stored bf16 for rows < L.
  auto t_of = [&](int i, int m) { return m <= i ? T_at(i, m) : 0.0f; };
  constexpr int NT = D / 16;
#pragma unroll 1
  for (int task = warp; task < 16; task += kGdnChunkThreads / 32) {
    const int r0 = ((task >> 1) & 3) * 16, cc = (task & 1) * (D / 2);
    float acc[NT][4];
    gdn_warp_zero(acc);
    bf16* dst;
    if (task < 8) {
      gdn_warp_mma<NT, C>(acc, r0, cc, t_of, [&](int m, int d) { return gdn_bf(Ks[m * LB + d]) * sw[m]; });
      dst = ws_w;
    } else {
      gdn_warp_mma<NT, C>(acc, r0, cc, t_of, [&](int m, int d) { return gdn_bf(Vs[m * LB + d]) * beta[m]; });
      dst = ws_u;
    }
    gdn_warp_store(acc, r0, cc, [&](int i, int j, float v0, float v1) {
      if (i < L) *reinterpret_cast<uint32_t*>(dst + ((t0 + i) * nv + h) * D + j) = pack_bf16x2(v0, v1);
    });
  }
  // Row scalars for the state pass: e^γ/‖q‖·dk^−½, e^(γ_C − γ)/‖k‖, and the chunk decay e^(γ_C).
  if (tid < L) {
    const float gc = gam[C - 1];  // rows ≥ L have g = 0, so this is γ of the last real row
    ws_s[(t0 + tid) * nv + h] = make_float4(expf(gam[tid]) * qn[tid], expf(gc - gam[tid]) * kn[tid], expf(gc), 0.0f);
  }
}

template <int D>
struct GdnStateSmem {
  static constexpr int C = kGdnChunk, kLdB = D + 8, kLdP = C + 8, kLdV = kGdnSlice + 8;
  static constexpr size_t kBytes =
      sizeof(bf16) * (3 * C * kLdB + C * kLdP) + sizeof(float) * (C * kLdV + D * kLdV + 2 * C + 4);
};

template <int D>
__global__ void __launch_bounds__(kGdnStateThreads, 2)
    gdn_state_kernel(const bf16* qkv, int64_t ld_qkv, const int32_t* cu, int nk, int nv, int dk, int dv,
                     const bf16* ws_w, const bf16* ws_u, const bf16* ws_p, const float4* ws_s, bf16* out,
                     int64_t ld_out) {
  using Sm = GdnStateSmem<D>;
  constexpr int C = kGdnChunk, BV = kGdnSlice, LB = Sm::kLdB, LP = Sm::kLdP, LV = Sm::kLdV;
  extern __shared__ __align__(16) unsigned char gdn_state_smem[];
  bf16* Ws = reinterpret_cast<bf16*>(gdn_state_smem);  // [C][LB]
  bf16* Qs = Ws + C * LB;                              // [C][LB] raw q rows
  bf16* Ks = Qs + C * LB;                              // [C][LB] raw k rows
  bf16* Ps = Ks + C * LB;                              // [C][LP] masked scores
  float* Vp = reinterpret_cast<float*>(Ps + C * LP);   // [C][LV] U slice, then V'
  float* S = Vp + C * LV;                              // [D][LV] state slice, key dim × value columns
  float* qs = S + D * LV;
  float* kd = qs + C;
  float* decay = kd + C;

  const int col0 = blockIdx.x * BV, h = blockIdx.y, seq = blockIdx.z, tid = threadIdx.x, warp = tid >> 5;
  const int kh = h / (nv / nk), start = cu[seq], len = cu[seq + 1] - start, r0 = warp * 16;
  for (int i = tid; i < D * LV; i += kGdnStateThreads) S[i] = 0.0f;

  for (int c0 = 0; c0 < len; c0 += C) {
    const int L = min(C, len - c0);
    const int64_t t0 = start + c0;
    __syncthreads();  // the previous chunk's readers of the tiles are done
    const bf16* row0 = qkv + t0 * ld_qkv;
    gdn_stage<D, kGdnStateThreads>(Ws, LB, ws_w + (t0 * nv + h) * D, (int64_t)nv * D, L, D);
    gdn_stage<D, kGdnStateThreads>(Qs, LB, row0 + (int64_t)kh * dk, ld_qkv, L, dk);
    gdn_stage<D, kGdnStateThreads>(Ks, LB, row0 + (int64_t)nk * dk + kh * dk, ld_qkv, L, dk);
    gdn_stage<C, kGdnStateThreads>(Ps, LP, ws_p + (t0 * nv + h) * C, (int64_t)nv * C, L, C);
    // The U slice (converted to fp32) and the row scalars load while the tile copies are in flight.
    constexpr int kU = C * (BV / 8) / kGdnStateThreads;
    static_assert(kU * kGdnStateThreads == C * (BV / 8), "U slice split");
    float u[kU][8];
#pragma unroll
    for (int e = 0; e < kU; ++e) {
      int i = tid + e * kGdnStateThreads, r = i / (BV / 8), d = (i % (BV / 8)) * 8;
#pragma unroll
      for (int x = 0; x < 8; ++x) u[e][x] = 0.0f;
      if (r < L) load_bf16(ws_u + ((t0 + r) * nv + h) * D + col0 + d, u[e]);
    }
    float4 s4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (tid < L) s4 = ws_s[(t0 + tid) * nv + h];
#pragma unroll
    for (int e = 0; e < kU; ++e) {
      int i = tid + e * kGdnStateThreads, r = i / (BV / 8), d = (i % (BV / 8)) * 8;
#pragma unroll
      for (int x = 0; x < 8; ++x) Vp[r * LV + d + x] = u[e][x];
    }
    if (tid < C) {
      qs[tid] = s4.x;
      kd[tid] = s4.y;
      if (tid == 0) decay[0] = s4.z;
    }
    gdn_stage_wait();
    __syncthreads();

    // V' = U − W S and the inter-chunk output (Q ⊙ e^γ) S; this warp's 16 rows × the slice.
    float av[BV / 8][4], ao[BV / 8][4];
    gdn_warp_zero(av);
    gdn_warp_zero(ao);
    auto s_of = [&](int k, int j) { return S[k * LV + j]; };
    gdn_warp_mma<BV / 8, D>(av, r0, 0, [&](int i, int k) { return gdn_bf(Ws[i * LB + k]); }, s_of);
    gdn_warp_mma<BV / 8, D>(ao, r0, 0, [&](int i, int k) { return gdn_bf(Qs[i * LB + k]) * qs[i]; }, s_of);
    gdn_warp_store(av, r0, 0, [&](int i, int j, float v0, float v1) {
      Vp[i * LV + j] -= v0;
      Vp[i * LV + j + 1] -= v1;
    });
    __syncthreads();  // V' complete; every reader of the old S is done

    auto v_of = [&](int k, int j) { return Vp[k * LV + j]; };
    gdn_warp_mma<BV / 8, C>(ao, r0, 0, [&](int i, int k) { return gdn_bf(Ps[i * LP + k]); }, v_of);
    bf16* orow = out + t0 * ld_out + (int64_t)h * dv + col0;
    gdn_warp_store(ao, r0, 0, [&](int i, int j, float v0, float v1) {
      if (i < L && col0 + j < dv) *reinterpret_cast<uint32_t*>(orow + i * ld_out + j) = pack_bf16x2(v0, v1);
    });
    const float dc = decay[0];
    for (int s = warp; s < D / 16; s += kGdnStateThreads / 32) {
      float as[BV / 8][4];
      gdn_warp_zero(as);
      gdn_warp_mma<BV / 8, C>(as, s * 16, 0, [&](int i, int k) { return gdn_bf(Ks[k * LB + i]) * kd[k]; }, v_of);
      gdn_warp_store(as, s * 16, 0, [&](int i, int j, float v0, float v1) {
        S[i * LV + j] = dc * S[i * LV + j] + v0;
        S[i * LV + j + 1] = dc * S[i * LV + j + 1] + v1;
      });
    }
  }
}

// ---- launchers ----
template <int D>
static void gdn_prefill_run(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b, int64_t ld_b,
                            const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out, const int32_t* cu,
                            int num_seqs, int64_t T, int max_len, int nk, int nv, int dk, int dv, cudaStream_t stream) {
  // Workspace rows follow the tokens: W and U [T, nv, D], scores [T, nv, 64] (bf16), row scalars [T, nv].
  const int64_t rows = T * nv;
  const size_t wu = sizeof(bf16) * rows * D, p = sizeof(bf16) * rows * kGdnChunk, sc = sizeof(float4) * rows;
  unsigned char* ws = nullptr;
  DF_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ws), 2 * wu + p + sc, stream));
  bf16* ws_w = reinterpret_cast<bf16*>(ws);
  bf16* ws_u = reinterpret_cast<bf16*>(ws + wu);
  bf16* ws_p = reinterpret_cast<bf16*>(ws + 2 * wu);
  float4* ws_s = reinterpret_cast<float4*>(ws + 2 * wu + p);

  const size_t smem1 = GdnChunkSmem<D>::kBytes, smem2 = GdnStateSmem<D>::kBytes;
  DF_CUDA_CHECK(cudaFuncSetAttribute(gdn_chunk_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem1)));
  DF_CUDA_CHECK(cudaFuncSetAttribute(gdn_state_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem2)));
  dim3 g1(num_seqs, (max_len + kGdnChunk - 1) / kGdnChunk, nv);
  gdn_chunk_kernel<D><<<g1, kGdnChunkThreads, smem1, stream>>>(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, cu, nk,
                                                               nv, dk, dv, ws_w, ws_u, ws_p, ws_s);
  DF_CUDA_CHECK_LAUNCH("gdn_chunk_kernel");
  dim3 g2(D / kGdnSlice, nv, num_seqs);
  gdn_state_kernel<D><<<g2, kGdnStateThreads, smem2, stream>>>(qkv, ld_qkv, cu, nk, nv, dk, dv, ws_w, ws_u, ws_p,
                                                               ws_s, out, ld_out);
  DF_CUDA_CHECK_LAUNCH("gdn_state_kernel");
  DF_CUDA_CHECK(cudaFreeAsync(ws, stream));
}

void gdn_prefill_launch(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b, int64_t ld_b,
                        const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out, const int32_t* cu,
                        int num_seqs, int64_t T, int max_len, int nk, int nv, int dk, int dv, cudaStream_t stream) {
  if (num_seqs == 0 || nv == 0 || T == 0 || max_len == 0) return;
  bool ok = dk <= 128 && dv <= 128 && dk % 8 == 0 && dv % 8 == 0 && nk > 0 && nv % nk == 0 && ld_qkv % 8 == 0 &&
            ld_out % 2 == 0 && reinterpret_cast<uintptr_t>(qkv) % 16 == 0 &&
            reinterpret_cast<uintptr_t>(out) % 4 == 0 && num_seqs <= 65535 && nv <= 65535;
  if (!ok)
    cuda_throw("gdn_prefill_launch",
               "needs key/value head dims multiples of 8 and <= 128, value heads a multiple of key heads, a "
               "16-byte aligned qkv with a row stride that is a multiple of 8, an even output stride and at most "
               "65535 sequences",
               __FILE__, __LINE__);
  int d = dk > dv ? dk : dv;
  if (d <= 32)
    gdn_prefill_run<32>(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, cu, num_seqs, T, max_len, nk, nv,
                        dk, dv, stream);
  else if (d <= 64)
    gdn_prefill_run<64>(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, cu, num_seqs, T, max_len, nk, nv,
                        dk, dv, stream);
  else
    gdn_prefill_run<128>(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, cu, num_seqs, T, max_len, nk,
                         nv, dk, dv, stream);
}

}  // namespace df
