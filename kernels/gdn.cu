// Gated DeltaNet chunked prefill (UT/WY form, chunk 64) in two kernels, so the sequential part is short.
// Per chunk (γ = cumsum g, Γ_ij = e^(γ_i − γ_j), A = strictly_lower(β K Kᵀ ⊙ Γ), T = (I + A)⁻¹):
//   W = T (β e^γ K),  U = T (β V),  V' = U − W S,  O = (Q ⊙ e^γ) S + lower_incl(Q Kᵀ ⊙ Γ) V',
//   S = e^(γ_C) S + (K ⊙ e^(γ_C − γ))ᵀ V'.
// gdn_chunk_kernel does everything that does not depend on S for every (chunk, value head) at once (T by
// 16×16 diagonal blocks and block rows of off-diagonal tensor-core products) and leaves W, U and the masked scores as
// bf16 rows of a workspace indexed by token. gdn_state_kernel then walks each (sequence, value head) with
// all of S in fp32 registers from a zero start, so no state crosses a sequence boundary. Gates, norms, T and
// S stay fp32; every product runs on bf16 tensor cores with fp32 accumulation, the fp32 operands (T, S, V')
// split into bf16 hi + lo so they keep 16 mantissa bits. Row strides are padded so ldmatrix rows spread
// over all banks. The fused form (gdn_mixer_launch, the whole DeltaNet mixer of a layer) reads the projection
// before the causal conv and runs conv + SiLU on the chunk kernel's tiles, and the gated RMSNorm in the state
// kernel's epilogue, so neither the conv output nor the un-normed output makes a round trip through memory.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/gdn_workspace.h"
#include "kernels/launchers.cuh"
#include "kernels/mma.cuh"

namespace df {

constexpr int kGdnChunkThreads = 256;
// Causal conv taps of the fused form (every Qwen3.5/3.6 model has 4); other sizes run the separate conv.
constexpr int kGdnConvTaps = 4;

// One prefill's pointers and sizes, passed by value to both kernels. The fused forms' fields are null otherwise.
struct GdnArgs {
  const bf16* qkv;  // [T, q | k | v] rows: after the conv, or (conv fused) before it
  int64_t ld_qkv;
  const float* conv_w;  // conv fused: the conv weights [2·nk·dk + nv·dv, kGdnConvTaps]
  bf16* qk;             // conv fused: the conv'd q | k rows [T, 2·nk·dk], chunk kernel → state kernel
  int64_t ld_qk;
  const bf16 *a, *b;
  int64_t ld_a, ld_b;
  const float *A_log, *dt_bias;
  const bf16* z;  // norm fused: the gated norm's gate [T, nv·dv], its weight [dv] and eps
  int64_t ld_z;
  const float* norm_w;
  float eps;
  bf16* out;
  int64_t ld_out;
  const int32_t* cu;
  int nk, nv, dk, dv;
  bf16 *ws_w, *ws_u, *ws_p;
  float4* ws_s;
};

// ---- kernels ----

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

// Rows r in [lo, hi) of X [ROWS][ldx] from row r − lo of src (row stride ld), its first n (a multiple of 8)
// bf16 columns; the other rows and the columns [n, D) are zero. Asynchronous (cp.async, 16 bytes each,
// zero-filled where out of range) so every copy of a tile is in flight at once; gdn_stage_wait completes them.
template <int D, int NTHR, int ROWS = kGdnChunk>
__device__ __forceinline__ void gdn_stage(bf16* X, int ldx, const bf16* src, int64_t ld, int lo, int hi, int n) {
  for (int i = threadIdx.x; i < ROWS * (D / 8); i += NTHR) {
    int r = i / (D / 8), d = (i % (D / 8)) * 8;
    bool in = r >= lo && r < hi && d < n;
    uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(X + r * ldx + d));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(in ? src + (int64_t)(r - lo) * ld + d : src), "r"(in ? 16 : 0));
  }
}

__device__ __forceinline__ void gdn_stage_wait() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// The q, k and v tiles: [kRows][kLdB] each, with the conv starting kGdnConvTaps − 1 tokens before the chunk.
template <int D, bool CONV>
struct GdnChunkSmem {
  static constexpr int C = kGdnChunk, kLdB = D + 8, kLdA = C + 4, kRows = C + (CONV ? kGdnConvTaps - 1 : 0);
  static constexpr size_t kBytes = 3 * sizeof(bf16) * kRows * kLdB + sizeof(float) * (C * kLdA + 5 * C);
  static_assert((3 * sizeof(bf16) * kRows * kLdB) % 16 == 0, "the fp32 part must stay 16-byte aligned");
};

// The fused form's causal conv + SiLU, in place on the q, k and v tiles X [3][ROWS][LB]: slot r holds token
// t0 − (K − 1) + r on entry (zeros before the sequence start) and the output of token t0 + r on exit (zero for
// r ≥ L). Output r reads slots r .. r + K − 1 and overwrites slot r, so a thread walking its rows downwards
// only overwrites what it has read, except the K − 1 slots past its segment, which the next segment's thread
// overwrites: those are read into registers before a barrier. A thread takes 4 channels of one tile over 32
// rows. The taps are summed in conv1d_silu's order with zeros where it skips a tap, so the outputs are
// bit for bit what conv1d_silu stores.
template <int D>
__device__ __forceinline__ void gdn_conv_silu_tiles(bf16* X, const GdnArgs& p, int kh, int h, int L) {
  constexpr int K = kGdnConvTaps, SEG = kGdnChunk / 2, CG = D / 4, LB = D + 8, ROWS = kGdnChunk + K - 1;
  static_assert(3 * CG * (kGdnChunk / SEG) <= kGdnChunkThreads, "one (tile, 4 channels, segment) per thread");
  const int cg = threadIdx.x % CG, seg = (threadIdx.x / CG) % 2, tile = threadIdx.x / (2 * CG);
  const bool live = tile < 3 && cg * 4 < (tile == 2 ? p.dv : p.dk);
  const int64_t ch = (tile == 0   ? (int64_t)kh * p.dk
                      : tile == 1 ? (int64_t)(p.nk + kh) * p.dk
                                  : 2LL * p.nk * p.dk + (int64_t)h * p.dv) + cg * 4;
  bf16* col = X + (live ? tile * ROWS * LB + cg * 4 : 0);
  const int r0 = seg * SEG;
  float w[4][K];
  uint2 past[K - 1];  // slots r0 + SEG .. r0 + SEG + K − 2
  if (live) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int j = 0; j < K; ++j) w[e][j] = p.conv_w[(ch + e) * K + j];
#pragma unroll
    for (int i = 0; i < K - 1; ++i) past[i] = *reinterpret_cast<const uint2*>(col + (r0 + SEG + i) * LB);
  }
  __syncthreads();
  if (!live) return;
  float win[K][4];  // win[j]: slot r + j, the tap-j token of output r
  auto unpack = [](uint2 u, float (&v)[4]) {
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
    v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
  };
#pragma unroll
  for (int j = 0; j < K - 1; ++j) unpack(*reinterpret_cast<const uint2*>(col + (r0 + j) * LB), win[j + 1]);
  auto step = [&](uint2 in, int r) {
#pragma unroll
    for (int j = 0; j < K - 1; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) win[j][e] = win[j + 1][e];
    unpack(in, win[K - 1]);
    float acc[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      acc[e] = 0.0f;
#pragma unroll
      for (int j = 0; j < K; ++j) acc[e] += w[e][j] * win[j][e];
      acc[e] = r < L ? silu_f32(acc[e]) : 0.0f;
    }
    *reinterpret_cast<uint2*>(col + r * LB) = make_uint2(pack_bf16x2(acc[0], acc[1]), pack_bf16x2(acc[2], acc[3]));
  };
#pragma unroll 4
  for (int r = r0; r < r0 + SEG - (K - 1); ++r) step(*reinterpret_cast<const uint2*>(col + (r + K - 1) * LB), r);
#pragma unroll
  for (int i = 0; i < K - 1; ++i) step(past[i], r0 + SEG - (K - 1) + i);
}

// CONV: qkv is the projection before the causal conv, which runs on the tiles (gdn_conv_silu_tiles).
template <int D, bool CONV>
__global__ void __launch_bounds__(kGdnChunkThreads, 3) gdn_chunk_kernel(const GdnArgs p) {
  using Sm = GdnChunkSmem<D, CONV>;
  constexpr int C = kGdnChunk, LB = Sm::kLdB, LA = Sm::kLdA;
  extern __shared__ __align__(16) unsigned char gdn_chunk_smem[];
  bf16* Qs = reinterpret_cast<bf16*>(gdn_chunk_smem);  // [kRows][LB] q, k, v rows (conv'd from here on)
  bf16* Ks = Qs + Sm::kRows * LB;
  bf16* Vs = Ks + Sm::kRows * LB;
  // [C][LA]: A strictly below the diagonal; T stored transposed (T_ij at [j][i]) on and above it.
  float* Am = reinterpret_cast<float*>(Vs + Sm::kRows * LB);
  float* gam = Am + C * LA;
  float* beta = gam + C;
  float* qn = beta + C;  // dk^−½ / ‖q‖
  float* kn = qn + C;    // 1 / ‖k‖
  float* sw = kn + C;    // β e^γ / ‖k‖

  const int nk = p.nk, nv = p.nv, dk = p.dk;
  const int seq = blockIdx.x, h = blockIdx.z, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int len = p.cu[seq + 1] - p.cu[seq], c0 = blockIdx.y * C;
  if (c0 >= len) return;
  const int64_t t0 = p.cu[seq] + c0;
  const int L = min(C, len - c0), kh = h / (nv / nk);
  const bf16* a_in = p.a;
  const bf16* b_in = p.b;
  const int64_t ld_a = p.ld_a, ld_b = p.ld_b;
  {
    // The fused form's tiles start K − 1 tokens early for the conv; at a sequence start those slots stay zero.
    constexpr int H = Sm::kRows - C;
    const int lo = c0 == 0 ? H : 0;
    const bf16* first = p.qkv + (t0 - (H - lo)) * p.ld_qkv;
    constexpr int R = Sm::kRows, NT = kGdnChunkThreads;
    gdn_stage<D, NT, R>(Qs, LB, first + (int64_t)kh * dk, p.ld_qkv, lo, L + H, dk);
    gdn_stage<D, NT, R>(Ks, LB, first + (int64_t)(nk + kh) * dk, p.ld_qkv, lo, L + H, dk);
    gdn_stage<D, NT, R>(Vs, LB, first + 2LL * nk * dk + (int64_t)h * p.dv, p.ld_qkv, lo, L + H, p.dv);
  }
  const float* A_log = p.A_log;
  const float* dt_bias = p.dt_bias;
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
  if constexpr (CONV) {
    gdn_conv_silu_tiles<D>(Qs, p, kh, h, L);
    __syncthreads();
    // The first value head of each key head hands its conv'd q and k rows to the state kernel.
    if (h % (nv / nk) == 0)
      for (int i = tid; i < 2 * C * (D / 8); i += kGdnChunkThreads) {
        const int k = i / (C * (D / 8)), r = (i / (D / 8)) % C, d = (i % (D / 8)) * 8;
        if (r < L && d < dk)
          *reinterpret_cast<uint4*>(p.qk + (t0 + r) * p.ld_qk + (int64_t)(k * nk + kh) * dk + d) =
              *reinterpret_cast<const uint4*>((k ? Ks : Qs) + r * LB + d);
      }
  }

  // γ = cumsum(g) (warp 0, two rows per lane), and the inverse row norms of q and k (two threads per row).
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
  {
    static_assert(kGdnChunkThreads == 4 * kGdnChunk, "two threads per q and k row");
    const int row = tid >> 1, r = row % C;
    const bf16* src = (row < C ? Qs : Ks) + r * LB + (tid & 1) * (D / 2);
    float ss = 0.0f;
#pragma unroll
    for (int d = 0; d < D / 2; d += 8) {
      float v[8];
      load_bf16<8>(src + d, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
    }
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);
    const float inv = rsqrtf(ss + 1e-6f);
    if ((tid & 1) == 0) (row < C ? qn : kn)[r] = row < C ? inv * q_scale : inv;
  }
  __syncthreads();
  if (tid < C) sw[tid] = beta[tid] * expf(gam[tid]) * kn[tid];

  // A (into Am) and the masked scores lower_incl(Q Kᵀ ⊙ Γ) (straight to the workspace); warp → 16 × 32 tile.
  // The operands are the raw bf16 rows, so the bf16 MMA is exact up to the fp32 accumulation.
  {
    const int r0 = (warp >> 1) * 16, cc = (warp & 1) * 32, mat = lane >> 3, r8 = lane & 7;
    float acc[4][4], accp[4][4];
    gdn_warp_zero(acc);
    gdn_warp_zero(accp);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int aoff = (r0 + (mat & 1) * 8 + r8) * LB + kk * 16 + (mat >> 1) * 8;
      uint32_t ak[4], aq[4];
      ldmatrix_x4(ak, Ks + aoff);
      ldmatrix_x4(aq, Qs + aoff);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, Ks + (cc + np * 16 + (mat >> 1) * 8 + r8) * LB + kk * 16 + (mat & 1) * 8);
        mma_bf16_16816(acc[2 * np], ak[0], ak[1], ak[2], ak[3], b[0], b[1]);
        mma_bf16_16816(acc[2 * np + 1], ak[0], ak[1], ak[2], ak[3], b[2], b[3]);
        mma_bf16_16816(accp[2 * np], aq[0], aq[1], aq[2], aq[3], b[0], b[1]);
        mma_bf16_16816(accp[2 * np + 1], aq[0], aq[1], aq[2], aq[3], b[2], b[3]);
      }
    }
    auto a_of = [&](int i, int j, float v) {
      return j < i ? beta[i] * kn[i] * kn[j] * expf(gam[i] - gam[j]) * v : 0.0f;
    };
    gdn_warp_store(acc, r0, cc, [&](int i, int j, float v0, float v1) {
      if (j < i) Am[i * LA + j] = a_of(i, j, v0);
      if (j + 1 < i) Am[i * LA + j + 1] = a_of(i, j + 1, v1);
    });
    auto p_of = [&](int i, int j, float v) { return j <= i ? qn[i] * kn[j] * expf(gam[i] - gam[j]) * v : 0.0f; };
    gdn_warp_store(accp, r0, cc, [&](int i, int j, float v0, float v1) {
      if (i < L)
        *reinterpret_cast<uint32_t*>(p.ws_p + ((t0 + i) * nv + h) * C + j) =
            pack_bf16x2(p_of(i, j, v0), p_of(i, j + 1, v1));
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
  // Block row bi: T_bi,bj = −T_bi,bi X with X = Σ_{bj ≤ bm < bi} A_bi,bm T_bm,bj, one warp per bj < bi, from
  // the block rows above. Both products run transposed on tensor cores (Xᵀ = Σ T_bm,bjᵀ A_bi,bmᵀ, then
  // T_bi,bjᵀ = −Xᵀ T_bi,biᵀ), so Xᵀ stays in registers as the next A operand; fp32 operands split into bf16
  // hi + lo (hi·hi + hi·lo + lo·hi).
  {
    const int g = lane >> 2, t = lane & 3;
    auto mma3 = [](float (&c)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], uint32_t bh0, uint32_t bh1,
                   uint32_t bl0, uint32_t bl1) {
      mma_bf16_16816(c, ah[0], ah[1], ah[2], ah[3], bh0, bh1);
      mma_bf16_16816(c, ah[0], ah[1], ah[2], ah[3], bl0, bl1);
      mma_bf16_16816(c, al[0], al[1], al[2], al[3], bh0, bh1);
    };
    for (int bi = 1; bi < 4; ++bi) {
      if (warp < bi) {
        const int cj = warp * 16, ri = bi * 16;
        float x[2][4];
        gdn_warp_zero(x);
        for (int m0 = cj; m0 < ri; m0 += 16) {
          uint32_t ah[4], al[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {  // Tᵀ[c][m] = T_mc, stored at [c][m]; zero where m < c
            const int c = cj + g + (e & 1) * 8, m = m0 + 2 * t + (e >> 1) * 8;
            const float2 v = *reinterpret_cast<const float2*>(Am + c * LA + m);
            split_bf16x2(m >= c ? v.x : 0.0f, m + 1 >= c ? v.y : 0.0f, ah[e], al[e]);
          }
#pragma unroll
          for (int n = 0; n < 2; ++n) {  // B[m][r] = A_rm
            const float* arow = Am + (ri + n * 8 + g) * LA + m0 + 2 * t;
            const float2 b0 = *reinterpret_cast<const float2*>(arow), b1 = *reinterpret_cast<const float2*>(arow + 8);
            uint32_t bh0, bl0, bh1, bl1;
            split_bf16x2(b0.x, b0.y, bh0, bl0);
            split_bf16x2(b1.x, b1.y, bh1, bl1);
            mma3(x[n], ah, al, bh0, bh1, bl0, bl1);
          }
        }
        uint32_t ah[4], al[4];
        acc_to_a_frag_split(x[0], x[1], ah, al);
        float y[2][4];
        gdn_warp_zero(y);
#pragma unroll
        for (int n = 0; n < 2; ++n) {  // B[k][r] = T_ii[r][k], stored at [ri + k][ri + r]; zero where r < k
          const int r = n * 8 + g;
          float tk[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int k = 2 * t + (e & 1) + (e >> 1) * 8;
            tk[e] = r >= k ? Am[(ri + k) * LA + ri + r] : 0.0f;
          }
          uint32_t bh0, bl0, bh1, bl1;
          split_bf16x2(tk[0], tk[1], bh0, bl0);
          split_bf16x2(tk[2], tk[3], bh1, bl1);
          mma3(y[n], ah, al, bh0, bh1, bl0, bl1);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {  // T_bi,bj[r][c] at [cj + c][ri + r]
          *reinterpret_cast<float2*>(Am + (cj + g) * LA + ri + n * 8 + 2 * t) = make_float2(-y[n][0], -y[n][1]);
          *reinterpret_cast<float2*>(Am + (cj + g + 8) * LA + ri + n * 8 + 2 * t) = make_float2(-y[n][2], -y[n][3]);
        }
      }
      __syncthreads();
    }
  }

  // W = (T diag(β e^γ/‖k‖)) K, U = (T diag(β)) V: 16 warp tasks of 16 rows × D/2 columns, stored bf16 for
  // rows < L. The scaled T (fp32, lower triangular) is the A operand split into bf16 hi + lo; the raw K and V
  // rows are the B operand through ldmatrix.trans.
  constexpr int NT = D / 16;
#pragma unroll 1
  for (int task = warp; task < 16; task += kGdnChunkThreads / 32) {
    const int r0 = ((task >> 1) & 3) * 16, cc = (task & 1) * (D / 2), mat = lane >> 3, r8 = lane & 7;
    const int g = lane >> 2, t = lane & 3;
    const bool is_w = task < 8;
    const bf16* X = is_w ? Ks : Vs;
    const float* scale = is_w ? sw : beta;
    auto a_at = [&](int i, int m) { return m <= i ? T_at(i, m) * scale[m] : 0.0f; };
    float acc[NT][4];
    gdn_warp_zero(acc);
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) {
      if (kk * 16 > r0) break;  // T is zero right of the diagonal block
      const int i0 = r0 + g, i1 = i0 + 8, m0 = kk * 16 + 2 * t;
      uint32_t ah[4], al[4];
      split_bf16x2(a_at(i0, m0), a_at(i0, m0 + 1), ah[0], al[0]);
      split_bf16x2(a_at(i1, m0), a_at(i1, m0 + 1), ah[1], al[1]);
      split_bf16x2(a_at(i0, m0 + 8), a_at(i0, m0 + 9), ah[2], al[2]);
      split_bf16x2(a_at(i1, m0 + 8), a_at(i1, m0 + 9), ah[3], al[3]);
#pragma unroll
      for (int nd = 0; nd < NT / 2; ++nd) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, X + (kk * 16 + (mat & 1) * 8 + r8) * LB + cc + nd * 16 + (mat >> 1) * 8);
        mma_split_a(acc[2 * nd], acc[2 * nd + 1], ah, al, b);
      }
    }
    bf16* dst = is_w ? p.ws_w : p.ws_u;
    gdn_warp_store(acc, r0, cc, [&](int i, int j, float v0, float v1) {
      if (i < L) *reinterpret_cast<uint32_t*>(dst + ((t0 + i) * nv + h) * D + j) = pack_bf16x2(v0, v1);
    });
  }
  // Row scalars for the state pass: e^γ/‖q‖·dk^−½, e^(γ_C − γ)/‖k‖, and the chunk decay e^(γ_C).
  if (tid < L) {
    const float gc = gam[C - 1];  // rows ≥ L have g = 0, so this is γ of the last real row
    p.ws_s[(t0 + tid) * nv + h] = make_float4(expf(gam[tid]) * qn[tid], expf(gc - gam[tid]) * kn[tid], expf(gc), 0.0f);
  }
}

// One state-pass pipeline stage: W, Q, K, U (and in the fused form the gate Z) tiles [C][kLdB], the masked
// scores [C][kLdP] (bf16) and the row scalars [C] of one chunk. Two stages: the next chunk's copies fly while
// this one is computed. The fused form's norm adds per-warp sums of squares [warps][C] and r [C] after them.
template <int D, bool NORM>
struct GdnStateSmem {
  static constexpr int C = kGdnChunk, kLdB = D + 8, kLdP = C + 8, kTiles = NORM ? 5 : 4, kWarps = D / 16;
  static constexpr size_t kTileBytes = sizeof(bf16) * (kTiles * C * kLdB + C * kLdP);
  static constexpr size_t kStage = kTileBytes + sizeof(float4) * C;
  static constexpr size_t kBytes = 2 * kStage + (NORM ? sizeof(float) * (kWarps + 1) * C : 0);
  static_assert(kTileBytes % 16 == 0, "row scalars must stay 16-byte aligned");
};

__device__ __forceinline__ void gdn_stage_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void gdn_stage_wait_groups() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// One block per (value head, sequence) walks the chunks with all of S: warp w keeps Sᵀ rows [16w, 16w + 16)
// (value columns × key dim) in fp32 registers in the MMA accumulator layout, which is also the A-fragment
// layout of the products that read S, so S never touches shared memory. Every product is transposed
// (value columns as M): V'ᵀ = Uᵀ − Sᵀ Wᵀ, Oᵀ = (Sᵀ Qᵀ) ⊙ qs + V'ᵀ Pᵀ, Sᵀ = e^(γ_C) Sᵀ + (V' ⊙ kd)ᵀ K, with the
// bf16 tiles as B fragments straight from ldmatrix. In the recurrence (V' and the S update) the fp32 side
// (S, V') is split into bf16 hi + lo, because an error there is carried into every later chunk. The two
// output products take the hi half only: their error (2^-9 relative per term, as in flash-linear-attention,
// which rounds S to bf16 for every product) stays in this chunk's O, which is rounded to bf16 anyway.
// CONV: the conv'd q and k rows are those the chunk kernel left in p.qk. NORM: the gated RMSNorm is applied to
// the fp32 O before its only rounding.
template <int D, bool CONV, bool NORM>
__global__ void __launch_bounds__(2 * D, 1) gdn_state_kernel(const GdnArgs p) {
  using Sm = GdnStateSmem<D, NORM>;
  constexpr int C = kGdnChunk, LB = Sm::kLdB, LP = Sm::kLdP, NTHR = 2 * D, NS = D / 8, NC = C / 8;
  extern __shared__ __align__(16) unsigned char gdn_state_smem[];
  const int nk = p.nk, nv = p.nv, dk = p.dk, dv = p.dv;
  const int h = blockIdx.x, seq = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3, mat = lane >> 3, r8 = lane & 7, v0 = warp * 16;
  const int kh = h / (nv / nk), start = p.cu[seq], len = p.cu[seq + 1] - start, chunks = (len + C - 1) / C;
  const bf16* qk = CONV ? p.qk : p.qkv;
  const int64_t ld_qk = CONV ? p.ld_qk : p.ld_qkv;

  auto tile = [&](int stage, int i) { return reinterpret_cast<bf16*>(gdn_state_smem + stage * Sm::kStage) + i * C * LB; };
  auto scores = [&](int stage) { return tile(stage, Sm::kTiles); };
  auto scalars = [&](int stage) { return reinterpret_cast<float4*>(scores(stage) + C * LP); };
  auto load = [&](int c, int stage) {
    const int L = min(C, len - c * C);
    const int64_t t0 = start + (int64_t)c * C;
    const bf16* row0 = qk + t0 * ld_qk;
    gdn_stage<D, NTHR>(tile(stage, 0), LB, p.ws_w + (t0 * nv + h) * D, (int64_t)nv * D, 0, L, D);
    gdn_stage<D, NTHR>(tile(stage, 1), LB, row0 + (int64_t)kh * dk, ld_qk, 0, L, dk);
    gdn_stage<D, NTHR>(tile(stage, 2), LB, row0 + (int64_t)(nk + kh) * dk, ld_qk, 0, L, dk);
    gdn_stage<D, NTHR>(tile(stage, 3), LB, p.ws_u + (t0 * nv + h) * D, (int64_t)nv * D, 0, L, D);
    if constexpr (NORM) gdn_stage<D, NTHR>(tile(stage, 4), LB, p.z + t0 * p.ld_z + (int64_t)h * dv, p.ld_z, 0, L, dv);
    gdn_stage<C, NTHR>(scores(stage), LP, p.ws_p + (t0 * nv + h) * C, (int64_t)nv * C, 0, L, C);
    float4* sc = scalars(stage);
    for (int r = threadIdx.x; r < C; r += NTHR) {
      uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(sc + r));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
                   "l"(r < L ? p.ws_s + (t0 + r) * nv + h : p.ws_s), "r"(r < L ? 16 : 0));
    }
    gdn_stage_commit();
  };

  float st[NS][4];
  gdn_warp_zero(st);
  float norm_w[2] = {0.0f, 0.0f};  // the gated norm's weights of this lane's value columns v0 + g (+ 8)
  if constexpr (NORM)
#pragma unroll
    for (int e = 0; e < 2; ++e) norm_w[e] = v0 + g + 8 * e < dv ? p.norm_w[v0 + g + 8 * e] : 0.0f;
  if (chunks > 0) load(0, 0);
  for (int c = 0; c < chunks; ++c) {
    if (c + 1 < chunks) {
      load(c + 1, (c + 1) & 1);
      gdn_stage_wait_groups<1>();
    } else {
      gdn_stage_wait_groups<0>();
    }
    __syncthreads();  // chunk c's tiles are visible to every warp
    const int stage = c & 1, L = min(C, len - c * C);
    const bf16 *Ws = tile(stage, 0), *Qs = tile(stage, 1), *Ks = tile(stage, 2), *Ps = scores(stage);
    bf16* Us = tile(stage, 3);
    const float4* sc = scalars(stage);

    // Sᵀ Wᵀ and Sᵀ Qᵀ over the key dim; the B rows are tokens, so ldmatrix reads W and Q rows as they lie.
    float vp[NC][4], oo[NC][4];
    gdn_warp_zero(vp);
    gdn_warp_zero(oo);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ah[4], al[4];
      acc_to_a_frag_split(st[2 * kk], st[2 * kk + 1], ah, al);
#pragma unroll
      for (int np = 0; np < C / 16; ++np) {
        const int off = (np * 16 + (mat >> 1) * 8 + r8) * LB + kk * 16 + (mat & 1) * 8;
        uint32_t b[4];
        ldmatrix_x4(b, Ws + off);
        mma_split_a(vp[2 * np], vp[2 * np + 1], ah, al, b);
        ldmatrix_x4(b, Qs + off);
        mma_bf16_16816(oo[2 * np], ah[0], ah[1], ah[2], ah[3], b[0], b[1]);
        mma_bf16_16816(oo[2 * np + 1], ah[0], ah[1], ah[2], ah[3], b[2], b[3]);
      }
    }
    // V'ᵀ = Uᵀ − Sᵀ Wᵀ (U through ldmatrix.trans lands in the accumulator layout) and Oᵀ scaled per token by qs.
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) {
      uint32_t u[4];
      ldmatrix_x4_trans(u, Us + (kk * 16 + (mat >> 1) * 8 + r8) * LB + v0 + (mat & 1) * 8);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float2 uf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u[e]));
        float* acc = vp[2 * kk + (e >> 1)] + 2 * (e & 1);
        acc[0] = uf.x - acc[0];
        acc[1] = uf.y - acc[1];
      }
    }
#pragma unroll
    for (int n = 0; n < NC; ++n) {
      const float q0 = sc[n * 8 + 2 * t].x, q1 = sc[n * 8 + 2 * t + 1].x;
      oo[n][0] *= q0;
      oo[n][1] *= q1;
      oo[n][2] *= q0;
      oo[n][3] *= q1;
    }
    const float dc = sc[0].z;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[n][e] *= dc;
    }
    // Per 16 tokens of V': Oᵀ += V'ᵀ Pᵀ (P lower triangular: only score rows at or past these tokens) and
    // Sᵀ += (V' ⊙ kd)ᵀ K (K rows are the k index: ldmatrix.trans).
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) {
      uint32_t ah[4], al[4];
      acc_to_a_frag_split(vp[2 * kk], vp[2 * kk + 1], ah, al);
#pragma unroll
      for (int np = kk; np < C / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, Ps + (np * 16 + (mat >> 1) * 8 + r8) * LP + kk * 16 + (mat & 1) * 8);
        mma_bf16_16816(oo[2 * np], ah[0], ah[1], ah[2], ah[3], b[0], b[1]);
        mma_bf16_16816(oo[2 * np + 1], ah[0], ah[1], ah[2], ah[3], b[2], b[3]);
      }
      const int tk = kk * 16 + 2 * t;
      const float k0 = sc[tk].y, k1 = sc[tk + 1].y, k8 = sc[tk + 8].y, k9 = sc[tk + 9].y;
      const float vk0[4] = {vp[2 * kk][0] * k0, vp[2 * kk][1] * k1, vp[2 * kk][2] * k0, vp[2 * kk][3] * k1};
      const float vk1[4] = {vp[2 * kk + 1][0] * k8, vp[2 * kk + 1][1] * k9, vp[2 * kk + 1][2] * k8,
                            vp[2 * kk + 1][3] * k9};
      acc_to_a_frag_split(vk0, vk1, ah, al);
#pragma unroll
      for (int nd = 0; nd < D / 16; ++nd) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, Ks + (kk * 16 + (mat & 1) * 8 + r8) * LB + nd * 16 + (mat >> 1) * 8);
        mma_split_a(st[2 * nd], st[2 * nd + 1], ah, al, b);
      }
    }
    if constexpr (NORM) {
      // Gated RMSNorm of each token's dv outputs: sums of squares over this warp's 16 columns by shuffles
      // (lanes of one t hold one token pair), over the warps through shared memory. Rows ≥ L and columns ≥ dv
      // hold zeros, so they add nothing and store nothing.
      float* ssq = reinterpret_cast<float*>(gdn_state_smem + 2 * Sm::kStage);  // [warps][C]
      float* rr = ssq + Sm::kWarps * C;                                          // [C]
#pragma unroll
      for (int n = 0; n < NC; ++n) {
        float s0 = oo[n][0] * oo[n][0] + oo[n][2] * oo[n][2], s1 = oo[n][1] * oo[n][1] + oo[n][3] * oo[n][3];
#pragma unroll
        for (int m = 4; m < 32; m <<= 1) {
          s0 += __shfl_xor_sync(0xffffffffu, s0, m);
          s1 += __shfl_xor_sync(0xffffffffu, s1, m);
        }
        if (g == 0) *reinterpret_cast<float2*>(ssq + warp * C + n * 8 + 2 * t) = make_float2(s0, s1);
      }
      __syncthreads();
      if (threadIdx.x < C) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < Sm::kWarps; ++w) s += ssq[w * C + threadIdx.x];
        rr[threadIdx.x] = rsqrtf(s / static_cast<float>(dv) + p.eps);
      }
      __syncthreads();
      const bf16* Zs = tile(stage, 4);
#pragma unroll
      for (int n = 0; n < NC; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = n * 8 + 2 * t + (e & 1), col = v0 + g + 8 * (e >> 1);
          oo[n][e] = gated_rmsnorm_apply(oo[n][e], rr[tok], norm_w[e >> 1], __bfloat162float(Zs[tok * LB + col]));
        }
    }
    // Oᵀ → this warp's own 16 columns of the U tile (only it read them), then rows of 32 bytes to the output.
#pragma unroll
    for (int n = 0; n < NC; ++n) {
      bf16* o = Us + (n * 8 + 2 * t) * LB + v0 + g;
      o[0] = __float2bfloat16(oo[n][0]);
      o[LB] = __float2bfloat16(oo[n][1]);
      o[8] = __float2bfloat16(oo[n][2]);
      o[LB + 8] = __float2bfloat16(oo[n][3]);
    }
    __syncwarp();
    const int64_t t0 = start + (int64_t)c * C;
    for (int e = lane; e < C * 8; e += 32) {
      const int r = e >> 3, col = v0 + (e & 7) * 2;
      if (r < L && col < dv)
        *reinterpret_cast<uint32_t*>(p.out + (t0 + r) * p.ld_out + (int64_t)h * dv + col) =
            *reinterpret_cast<const uint32_t*>(Us + r * LB + col);
    }
    __syncthreads();  // every warp is done with this stage before chunk c + 2 is copied into it
  }
}

// ---- launchers ----
template <int D, bool CONV, bool NORM>
static void gdn_prefill_run(GdnArgs p, int num_seqs, int64_t T, int max_len, unsigned char* ws,
                            cudaStream_t stream) {
  const GdnWorkspaceLayout l = gdn_prefill_workspace_layout(T, p.nv, p.dk, p.dv);
  p.ws_w = reinterpret_cast<bf16*>(ws + l.w);
  p.ws_u = reinterpret_cast<bf16*>(ws + l.u);
  p.ws_p = reinterpret_cast<bf16*>(ws + l.scores);
  p.ws_s = reinterpret_cast<float4*>(ws + l.scalars);
  const size_t smem1 = GdnChunkSmem<D, CONV>::kBytes, smem2 = GdnStateSmem<D, NORM>::kBytes;
  DF_CUDA_CHECK(cudaFuncSetAttribute(gdn_chunk_kernel<D, CONV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem1)));
  DF_CUDA_CHECK(cudaFuncSetAttribute(gdn_state_kernel<D, CONV, NORM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem2)));
  dim3 g1(num_seqs, (max_len + kGdnChunk - 1) / kGdnChunk, p.nv);
  gdn_chunk_kernel<D, CONV><<<g1, kGdnChunkThreads, smem1, stream>>>(p);
  DF_CUDA_CHECK_LAUNCH("gdn_chunk_kernel");
  dim3 g2(p.nv, num_seqs);
  gdn_state_kernel<D, CONV, NORM><<<g2, 2 * D, smem2, stream>>>(p);
  DF_CUDA_CHECK_LAUNCH("gdn_state_kernel");
}

template <bool CONV, bool NORM>
static void gdn_prefill_dispatch(const GdnArgs& p, int num_seqs, int64_t T, int max_len, void* ws, size_t ws_bytes,
                                 cudaStream_t stream) {
  const size_t need = gdn_prefill_workspace_bytes(T, p.nv, p.dk, p.dv);
  if (ws == nullptr || ws_bytes < need || reinterpret_cast<uintptr_t>(ws) % 16 != 0) {
    char what[512];
    std::snprintf(
        what, sizeof(what),
        "gdn_prefill needs a 16-byte aligned workspace of %zu bytes for %lld tokens x %d value heads "
        "(dk %d, dv %d) but got %zu bytes at %p; plan it once with gdn_prefill_workspace_bytes / "
        "Ops::gdn_workspace_bytes for the largest batch",
        need, (long long)T, p.nv, p.dk, p.dv, ws == nullptr ? size_t(0) : ws_bytes, ws);
    cuda_throw(CONV ? "gdn_mixer_launch" : "gdn_prefill_launch", what, __FILE__, __LINE__);
  }
  unsigned char* w = static_cast<unsigned char*>(ws);
  const int d = gdn_prefill_tile_dim(p.dk, p.dv);
  if (d == 32)
    gdn_prefill_run<32, CONV, NORM>(p, num_seqs, T, max_len, w, stream);
  else if (d == 64)
    gdn_prefill_run<64, CONV, NORM>(p, num_seqs, T, max_len, w, stream);
  else
    gdn_prefill_run<128, CONV, NORM>(p, num_seqs, T, max_len, w, stream);
}

// DFLASH_GDN=recurrent sends every prefill to the fp32 token recurrence (decode.cu) instead of the chunked
// kernels, so the golden tests can tell how much of a model's bf16 error the chunked form's roundings add.
static bool gdn_recurrent_forced() {
  static const bool forced = [] {
    const char* e = std::getenv("DFLASH_GDN");
    return e && std::strcmp(e, "recurrent") == 0;
  }();
  return forced;
}

// How much of the mixer runs fused: DFLASH_GDN_FUSE=0 runs its three separate kernels (conv1d_silu,
// gdn_prefill, gated_rmsnorm), =conv fuses the conv only (the gated norm stays its own kernel), anything else
// or unset both. Read per call so one process can time and test every form.
enum class GdnFuse { none, conv, conv_norm };
static GdnFuse gdn_fuse_mode() {
  const char* e = std::getenv("DFLASH_GDN_FUSE");
  if (e && std::strcmp(e, "0") == 0) return GdnFuse::none;
  if (e && std::strcmp(e, "conv") == 0) return GdnFuse::conv;
  return GdnFuse::conv_norm;
}

// Whether the chunked kernels can read this layout (otherwise the token recurrence runs).
static bool gdn_chunked_layout(const bf16* qkv, int64_t ld_qkv, const bf16* out, int64_t ld_out, int num_seqs,
                               int nk, int nv, int dk, int dv) {
  return gdn_prefill_chunked_shape(dk, dv) && nk > 0 && nv % nk == 0 && ld_qkv % 8 == 0 && ld_out % 2 == 0 &&
         reinterpret_cast<uintptr_t>(qkv) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0 &&
         num_seqs <= 65535 && nv <= 65535 && !gdn_recurrent_forced();
}

void gdn_prefill_launch(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b,
                        int64_t ld_b, const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out,
                        const int32_t* cu, int num_seqs, int64_t T, int max_len, int nk, int nv, int dk,
                        int dv, void* ws, size_t ws_bytes, cudaStream_t stream) {
  if (num_seqs == 0 || nv == 0 || T == 0 || max_len == 0) return;
  // The token recurrence (decode.cu): any dims, no workspace.
  if (!gdn_chunked_layout(qkv, ld_qkv, out, ld_out, num_seqs, nk, nv, dk, dv))
    return gdn_prefill_recurrent_launch(qkv, ld_qkv, a, ld_a, b, ld_b, A_log, dt_bias, out, ld_out, cu, num_seqs, T,
                                        nk, nv, dk, dv, stream);
  GdnArgs p{};
  p.qkv = qkv, p.ld_qkv = ld_qkv, p.a = a, p.ld_a = ld_a, p.b = b, p.ld_b = ld_b, p.A_log = A_log;
  p.dt_bias = dt_bias, p.out = out, p.ld_out = ld_out, p.cu = cu, p.nk = nk, p.nv = nv, p.dk = dk, p.dv = dv;
  gdn_prefill_dispatch<false, false>(p, num_seqs, T, max_len, ws, ws_bytes, stream);
}

void gdn_mixer_launch(const bf16* x, int64_t ld_x, const float* conv_w, int conv_k, const bf16* z, int64_t ld_z,
                      const bf16* a, int64_t ld_a, const bf16* b, int64_t ld_b, const float* A_log,
                      const float* dt_bias, const float* norm_w, float eps, bf16* out, int64_t ld_out,
                      const int32_t* cu, const int32_t* pos, int num_seqs, int64_t T, int max_len, int nk, int nv,
                      int dk, int dv, bf16* conv, int64_t ld_conv, bf16* o, int64_t ld_o, void* ws, size_t ws_bytes,
                      cudaStream_t stream) {
  if (num_seqs == 0 || nv == 0 || T == 0 || max_len == 0) return;
  const int64_t vdim = (int64_t)nv * dv, qk_cols = 2LL * nk * dk;
  auto al = [](const void* q, uintptr_t n) { return reinterpret_cast<uintptr_t>(q) % n == 0; };
  const GdnFuse mode = gdn_fuse_mode();
  const bool fused = mode != GdnFuse::none && conv_k == kGdnConvTaps &&
                     gdn_chunked_layout(x, ld_x, out, ld_out, num_seqs, nk, nv, dk, dv) && ld_z % 8 == 0 &&
                     ld_conv % 8 == 0 && ld_o % 2 == 0 && al(z, 16) && al(conv, 16) && al(o, 4);
  if (!fused) {
    conv1d_silu_launch(x, ld_x, conv_w, conv_k, conv, ld_conv, pos, T, qk_cols + vdim, stream);
    gdn_prefill_launch(conv, ld_conv, a, ld_a, b, ld_b, A_log, dt_bias, o, ld_o, cu, num_seqs, T, max_len, nk, nv,
                       dk, dv, ws, ws_bytes, stream);
    gated_rmsnorm_launch(o, ld_o, z, ld_z, norm_w, out, ld_out, T, nv, dv, eps, stream);
    return;
  }
  GdnArgs p{};
  p.qkv = x, p.ld_qkv = ld_x, p.conv_w = conv_w, p.qk = conv + vdim, p.ld_qk = ld_conv;
  p.a = a, p.ld_a = ld_a, p.b = b, p.ld_b = ld_b, p.A_log = A_log, p.dt_bias = dt_bias;
  p.cu = cu, p.nk = nk, p.nv = nv, p.dk = dk, p.dv = dv;
  if (mode == GdnFuse::conv) {
    p.out = o, p.ld_out = ld_o;
    gdn_prefill_dispatch<true, false>(p, num_seqs, T, max_len, ws, ws_bytes, stream);
    gated_rmsnorm_launch(o, ld_o, z, ld_z, norm_w, out, ld_out, T, nv, dv, eps, stream);
    return;
  }
  p.z = z, p.ld_z = ld_z, p.norm_w = norm_w, p.eps = eps, p.out = out, p.ld_out = ld_out;
  gdn_prefill_dispatch<true, true>(p, num_seqs, T, max_len, ws, ws_bytes, stream);
}

}  // namespace df
