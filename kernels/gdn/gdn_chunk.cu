// Gated DeltaNet chunked prefill, the chunk kernel (kernels/gdn/gdn.cu has the scheme, the state kernel and the
// launchers): per (chunk, value head) everything that does not depend on the state (γ, the norms, T = (I +
// A)⁻¹, W, U and the masked scores) into the workspace, and in the fused form the causal conv + SiLU on its
// tiles. A CTA per key head does the q / k work once for all of its value heads.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/primitives/cuda_check.cuh"
#include "kernels/dispatch/dispatch.h"
#include "kernels/primitives/device_math.cuh"
#include "kernels/gdn/gdn.cuh"
#include "kernels/primitives/mma.cuh"

namespace df {

constexpr int kGdnChunkThreads = 256;

// ---- kernels ----

// threadIdx.x, read afresh at every use. The per-key-head kernel runs the per-value-head helpers in a loop,
// and the compiler would otherwise hoist every index they derive from the thread out of it, keeping them live
// (spilled) across the value heads.
__device__ __forceinline__ int gdn_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// epi(i, j, v_j, v_j+1) for each pair of adjacent columns this lane holds (every element in one lane).
template <int NT, class F>
__device__ __forceinline__ void gdn_warp_store(const float (&acc)[NT][4], int r0, int c0, F epi) {
  const int lane = gdn_tid() & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    epi(r0 + g, c0 + n * 8 + 2 * t, acc[n][0], acc[n][1]);
    epi(r0 + g + 8, c0 + n * 8 + 2 * t, acc[n][2], acc[n][3]);
  }
}

// The q, k and v tiles: [kRows][kLdB] each, with the conv starting kGdnConvTaps − 1 tokens before the chunk;
// then Am [C][kLdA] (A strictly below the diagonal, T stored transposed, T_ij at [j][i], on and above it) and
// the row vectors γ, β, qn = dk^−½ / ‖q‖, kn = 1 / ‖k‖ and sw = β e^γ / ‖k‖ [C] each.
template <int D, bool CONV>
struct GdnChunkSmem {
  static constexpr int C = kGdnChunk, kLdB = D + 8, kLdA = C + 4, kRows = C + (CONV ? kGdnConvTaps - 1 : 0);
  static constexpr size_t kBytes = 3 * sizeof(bf16) * kRows * kLdB + sizeof(float) * (C * kLdA + 5 * C);
  static_assert((3 * sizeof(bf16) * kRows * kLdB) % 16 == 0, "the fp32 part must stay 16-byte aligned");
  // The per-key-head form's raw products [C][kLdA] fp32 (gdn_raw_save): in the q tile once q is read where
  // they fit (D 128), else after the vectors.
  static constexpr size_t kRawBytes = sizeof(float) * C * kLdA, kQBytes = sizeof(bf16) * kRows * kLdB;
  static constexpr bool kRawInQ = kRawBytes <= kQBytes;
  static constexpr size_t kKhBytes = kBytes + (kRawInQ ? 0 : kRawBytes);
  static_assert(kKhBytes <= kSmemOptinLeast,
                "one form for every device: it fits the least shared memory a block has");
  bf16 *Qs, *Ks, *Vs;
  float *Am, *gam, *beta, *qn, *kn, *sw, *raw;
  __device__ explicit GdnChunkSmem(unsigned char* base) {
    Qs = reinterpret_cast<bf16*>(base);
    Ks = Qs + kRows * kLdB;
    Vs = Ks + kRows * kLdB;
    Am = reinterpret_cast<float*>(Vs + kRows * kLdB);
    gam = Am + C * kLdA;
    beta = gam + C;
    qn = beta + C;
    kn = qn + C;
    sw = kn + C;
    raw = kRawInQ ? reinterpret_cast<float*>(Qs) : sw + C;
  }
  // Columns [col, col + n) of the chunk's rows into X (rows ≥ L zero); the fused form's tiles start K − 1
  // tokens early for the conv, and at a sequence start those slots stay zero.
  __device__ static void stage(bf16* X, const GdnArgs& p, int64_t t0, int c0, int L, int64_t col, int n) {
    constexpr int H = kRows - C;
    const int lo = c0 == 0 ? H : 0;
    gdn_stage<D, kGdnChunkThreads, kRows>(X, kLdB, p.qkv + (t0 - (H - lo)) * p.ld_qkv + col, p.ld_qkv, lo,
                                          L + H, n);
  }
};

// The fused form's causal conv + SiLU, in place on TILES consecutive tiles X [TILES][ROWS][LB] of the q, k, v
// order from tile `first` (0 q, 1 k, 2 v of value head h): slot r holds token t0 − (K − 1) + r on entry
// (zeros before the sequence start) and the output of token t0 + r on exit (zero for r ≥ L). Output r reads
// slots r .. r + K − 1 and overwrites slot r, so a thread walking its SEG rows downwards only overwrites what
// it has read, except the K − 1 slots past its segment, which the next segment's thread overwrites: those are
// read into registers before a barrier. A thread takes 4 channels of one tile over one segment. The taps are
// summed in conv1d_silu's order with zeros where it skips a tap, so the outputs are bit for bit what
// conv1d_silu stores, whatever the segment length.
template <int D, int TILES, int SEG>
__device__ __forceinline__ void gdn_conv_silu_tiles(bf16* X, const GdnArgs& p, int first, int kh, int h,
                                                    int L) {
  constexpr int K = kGdnConvTaps, CG = D / 4, LB = D + 8, ROWS = kGdnChunk + K - 1, NSEG = kGdnChunk / SEG;
  static_assert(kGdnChunk % SEG == 0 && SEG >= K - 1,
                "a segment holds at least the K − 1 slots read past it");
  static_assert(TILES * CG * NSEG <= kGdnChunkThreads, "one (tile, 4 channels, segment) per thread");
  const int cg = gdn_tid() % CG, seg = (gdn_tid() / CG) % NSEG, local = gdn_tid() / (NSEG * CG);
  const int tile = first + local;
  const bool live = local < TILES && cg * 4 < (tile == 2 ? p.dv : p.dk);
  const int64_t ch = (tile == 0   ? (int64_t)kh * p.dk
                      : tile == 1 ? (int64_t)(p.nk + kh) * p.dk
                                  : 2LL * p.nk * p.dk + (int64_t)h * p.dv) + cg * 4;
  bf16* col = X + (live ? local * ROWS * LB + cg * 4 : 0);
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

// g and β of chunk row r for value head h (zeros past the chunk's L rows); softplus as torch's, threshold 20.
__device__ __forceinline__ void gdn_gate_row(const GdnArgs& p, int64_t t0, int L, int r, int h, float& g,
                                             float& bt) {
  g = 0.0f, bt = 0.0f;
  if (r < L) {
    const int64_t t = t0 + r;
    const float x = __bfloat162float(p.a[t * p.ld_a + h]) + p.dt_bias[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    g = -expf(p.A_log[h]) * sp;
    bt = sigmoid_f32(__bfloat162float(p.b[t * p.ld_b + h]));
  }
}

// γ = cumsum(g) over the chunk in one warp, each lane holding rows 2·lane (v0) and 2·lane + 1 (v1), in place.
__device__ __forceinline__ void gdn_warp_cumsum(float& v0, float& v1) {
  static_assert(kGdnChunk == 64, "two rows per lane");
  const int lane = gdn_tid() & 31;
  const float s = v0 + v1;
  float incl = s;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float up = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += up;
  }
  v0 = incl - s + v0;
  v1 = incl;
}

// The inverse row norms of q (times dk^−½) and k, two threads per row.
template <int D>
__device__ __forceinline__ void gdn_row_norms(const bf16* Qs, const bf16* Ks, float* qn, float* kn, int dk) {
  static_assert(kGdnChunkThreads == 4 * kGdnChunk, "two threads per q and k row");
  constexpr int C = kGdnChunk, LB = D + 8;
  const int tid = gdn_tid(), row = tid >> 1, r = row % C;
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
  if ((tid & 1) == 0) (row < C ? qn : kn)[r] = row < C ? inv * rsqrtf(static_cast<float>(dk)) : inv;
}

// The fused form hands the conv'd q and k rows of key head kh to the state kernel.
template <int D>
__device__ __forceinline__ void gdn_qk_copy_out(const bf16* Qs, const bf16* Ks, const GdnArgs& p, int64_t t0,
                                                int L, int kh) {
  constexpr int C = kGdnChunk, LB = D + 8;
  for (int i = gdn_tid(); i < 2 * C * (D / 8); i += kGdnChunkThreads) {
    const int k = i / (C * (D / 8)), r = (i / (D / 8)) % C, d = (i % (D / 8)) * 8;
    if (r < L && d < p.dk)
      *reinterpret_cast<uint4*>(p.qk + (t0 + r) * p.ld_qk + (int64_t)(k * p.nk + kh) * p.dk + d) =
          *reinterpret_cast<const uint4*>((k ? Ks : Qs) + r * LB + d);
  }
}

// The raw K Kᵀ (acc) and Q Kᵀ (accp) of this warp's 16 × 32 tile, rows (warp / 2)·16, columns (warp % 2)·32.
// The operands are the raw bf16 rows, so the bf16 MMA is exact up to the fp32 accumulation. They depend on
// the key head only: the per-key-head form forms them once and keeps them in shared memory for its value heads
// (gdn_raw_save / gdn_raw_load).
template <int D>
__device__ __forceinline__ void gdn_raw_products(const bf16* Qs, const bf16* Ks, float (&acc)[4][4],
                                                 float (&accp)[4][4]) {
  constexpr int LB = D + 8;
  const int lane = gdn_tid() & 31, warp = gdn_tid() >> 5;
  const int r0 = (warp >> 1) * 16, cc = (warp & 1) * 32, mat = lane >> 3, r8 = lane & 7;
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
}

// The per-key-head form keeps the raw products in shared memory across its value heads, both in one [C][LA]
// fp32 square: Q Kᵀ on and below the diagonal as it lies, K Kᵀ (only its strictly lower part is read)
// transposed above it. Every slot is written once; gdn_raw_load reads them back into gdn_raw_products'
// layout, the exact fp32 values (entries the scaled stores mask read whatever the other triangle holds).
template <int LA>
__device__ __forceinline__ void gdn_raw_save(const float (&acc)[4][4], const float (&accp)[4][4], float* M) {
  const int warp = gdn_tid() >> 5, r0 = (warp >> 1) * 16, cc = (warp & 1) * 32;
  gdn_warp_store(acc, r0, cc, [&](int i, int j, float v0, float v1) {
    if (j < i) M[j * LA + i] = v0;
    if (j + 1 < i) M[(j + 1) * LA + i] = v1;
  });
  gdn_warp_store(accp, r0, cc, [&](int i, int j, float v0, float v1) {
    if (j <= i) M[i * LA + j] = v0;
    if (j + 1 <= i) M[i * LA + j + 1] = v1;
  });
}

template <int LA>
__device__ __forceinline__ void gdn_raw_load(const float* M, float (&acc)[4][4], float (&accp)[4][4]) {
  const int lane = gdn_tid() & 31, warp = gdn_tid() >> 5, g = lane >> 2, t = lane & 3;
  const int r0 = (warp >> 1) * 16, cc = (warp & 1) * 32;
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = r0 + g + (e >> 1) * 8, j = cc + n * 8 + 2 * t + (e & 1);
      acc[n][e] = M[j * LA + i];
      accp[n][e] = M[i * LA + j];
    }
}

// What scales with value head h's gates (γ, β in shared memory, the norms qn, kn): sw, A = strictly_lower(β K
// Kᵀ ⊙ Γ) / ‖k_i‖‖k_j‖ into Am and the masked scores lower_incl(Q Kᵀ ⊙ Γ) (normed) straight to the workspace.
template <class Sm>
__device__ __forceinline__ void gdn_scaled_stores(const float (&acc)[4][4], const float (&accp)[4][4],
                                                  const Sm& s, const GdnArgs& p, int64_t t0, int L, int h) {
  constexpr int C = kGdnChunk, LA = Sm::kLdA;
  const int tid = gdn_tid(), warp = tid >> 5, r0 = (warp >> 1) * 16, cc = (warp & 1) * 32;
  const float *gam = s.gam, *beta = s.beta, *qn = s.qn, *kn = s.kn;
  if (tid < C) s.sw[tid] = beta[tid] * expf(gam[tid]) * kn[tid];
  auto a_of = [&](int i, int j, float v) {
    return j < i ? beta[i] * kn[i] * kn[j] * expf(gam[i] - gam[j]) * v : 0.0f;
  };
  gdn_warp_store(acc, r0, cc, [&](int i, int j, float v0, float v1) {
    if (j < i) s.Am[i * LA + j] = a_of(i, j, v0);
    if (j + 1 < i) s.Am[i * LA + j + 1] = a_of(i, j + 1, v1);
  });
  auto p_of = [&](int i, int j, float v) {
    return j <= i ? qn[i] * kn[j] * expf(gam[i] - gam[j]) * v : 0.0f;
  };
  gdn_warp_store(accp, r0, cc, [&](int i, int j, float v0, float v1) {
    if (i < L)
      *reinterpret_cast<uint32_t*>(p.ws_p + ((t0 + i) * p.nv + h) * C + j) =
          pack_bf16x2(p_of(i, j, v0), p_of(i, j + 1, v1));
  });
}

// T = (I + A)⁻¹ in place in Am (A visible to every thread on entry; T visible on return). Diagonal 16×16
// blocks: forward substitution, one column per thread in registers.
template <int LA>
__device__ __forceinline__ void gdn_solve(float* Am) {
  constexpr int C = kGdnChunk;
  const int tid = gdn_tid(), lane = tid & 31, warp = tid >> 5;
  auto A_at = [&](int i, int j) { return Am[i * LA + j]; };  // i > j
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
  const int g = lane >> 2, t = lane & 3;
  auto mma3 = [](float(&c)[4], const uint32_t(&ah)[4], const uint32_t(&al)[4], uint32_t bh0, uint32_t bh1,
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
          const float2 b0 = *reinterpret_cast<const float2*>(arow),
                       b1 = *reinterpret_cast<const float2*>(arow + 8);
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
        *reinterpret_cast<float2*>(Am + (cj + g + 8) * LA + ri + n * 8 + 2 * t) =
            make_float2(-y[n][2], -y[n][3]);
      }
    }
    __syncthreads();
  }
}

// W = (T diag(β e^γ/‖k‖)) K, U = (T diag(β)) V for value head h (its v tile Vs): 16 warp tasks of 16 rows ×
// D/2 columns, stored bf16 for rows < L. The scaled T (fp32, lower triangular) is the A operand split into
// bf16 hi + lo; the raw K and V rows are the B operand through ldmatrix.trans. Then the row scalars for the
// state pass: e^γ/‖q‖·dk^−½, e^(γ_C − γ)/‖k‖, and the chunk decay e^(γ_C).
template <int D, class Sm>
__device__ __forceinline__ void gdn_wu_scalars(const Sm& s, const bf16* Vs, const GdnArgs& p, int64_t t0,
                                               int L, int h) {
  constexpr int C = kGdnChunk, LB = Sm::kLdB, LA = Sm::kLdA, NT = D / 16;
  const int tid = gdn_tid(), lane = tid & 31, warp = tid >> 5, nv = p.nv;
  auto T_at = [&](int i, int j) { return s.Am[j * LA + i]; };  // i ≥ j
#pragma unroll 1
  for (int task = warp; task < 16; task += kGdnChunkThreads / 32) {
    const int r0 = ((task >> 1) & 3) * 16, cc = (task & 1) * (D / 2), mat = lane >> 3, r8 = lane & 7;
    const int g = lane >> 2, t = lane & 3;
    const bool is_w = task < 8;
    const bf16* X = is_w ? s.Ks : Vs;
    const float* scale = is_w ? s.sw : s.beta;
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
  if (tid < L) {
    const float gc = s.gam[C - 1];  // rows ≥ L have g = 0, so this is γ of the last real row
    p.ws_s[(t0 + tid) * nv + h] =
        make_float4(expf(s.gam[tid]) * s.qn[tid], expf(gc - s.gam[tid]) * s.kn[tid], expf(gc), 0.0f);
  }
}

// One CTA per (sequence, chunk, key head), walking the key head's nv / nk value heads in turn. CONV: qkv is
// the projection before the causal conv, which runs on the tiles (gdn_conv_silu_tiles). Once per CTA: the q
// and k staging and conv, their copy-out (fused form), the norms qn and kn, and the raw K Kᵀ and Q Kᵀ. Per
// value head: the v tile (staged and convolved alone), g and β, γ, the scaled A and scores, T, W, U and the
// row scalars. The raw products wait for the next value head in shared memory (the q tile at D 128): held in
// registers they spill even at 128 registers a thread. The next head's v is staged once U has read this
// head's v, which keeps 3 CTAs an SM in 80 registers (staged early into a second tile, 2 CTAs fit an SM and
// the kernel is slower).
template <int D, bool CONV>
__global__ void __launch_bounds__(kGdnChunkThreads, 3) gdn_chunk_kh_kernel(const GdnArgs p) {
  using Sm = GdnChunkSmem<D, CONV>;
  constexpr int C = kGdnChunk, LA = Sm::kLdA;
  // One (4 channels, segment) per thread over the v tile alone, at least K − 1 rows a segment.
  constexpr int kSegV =
      kGdnChunk * (D / 4) / kGdnChunkThreads < 4 ? 4 : kGdnChunk * (D / 4) / kGdnChunkThreads;
  extern __shared__ __align__(16) unsigned char gdn_chunk_smem[];
  const int heads = p.nv / p.nk;
  {
    const Sm s(gdn_chunk_smem);
    const int nk = p.nk, dk = p.dk, seq = blockIdx.x, kh = blockIdx.z;
    const int len = p.cu[seq + 1] - p.cu[seq], c0 = blockIdx.y * C;
    if (c0 >= len) return;
    const int64_t t0 = p.cu[seq] + c0;
    const int L = min(C, len - c0);
    Sm::stage(s.Qs, p, t0, c0, L, (int64_t)kh * dk, dk);
    Sm::stage(s.Ks, p, t0, c0, L, (int64_t)(nk + kh) * dk, dk);
    Sm::stage(s.Vs, p, t0, c0, L, 2LL * nk * dk + (int64_t)kh * heads * p.dv, p.dv);
    gdn_stage_wait();
    __syncthreads();
    if constexpr (CONV) {
      gdn_conv_silu_tiles<D, 3, C / 2>(s.Qs, p, 0, kh, kh * heads, L);
      __syncthreads();
      gdn_qk_copy_out<D>(s.Qs, s.Ks, p, t0, L, kh);
    }
    gdn_row_norms<D>(s.Qs, s.Ks, s.qn, s.kn, dk);
    float acc[4][4], accp[4][4];
    gdn_raw_products<D>(s.Qs, s.Ks, acc, accp);
    if constexpr (Sm::kRawInQ) __syncthreads();  // every warp has read q
    gdn_raw_save<LA>(acc, accp, s.raw);
  }
#pragma unroll 1
  for (int j = 0; j < heads; ++j) {
    // Everything but j is rebuilt from an opaque zero each head, so the compiler keeps nothing else live
    // across the loop (hoisted, it spills).
    int zero;
    asm volatile("mov.b32 %0, 0;" : "=r"(zero));
    const Sm s(gdn_chunk_smem + zero);
    const int seq = blockIdx.x + zero, kh = blockIdx.z + zero, c0 = (blockIdx.y + zero) * C,
              h = kh * heads + j;
    const int64_t t0 = p.cu[seq] + c0, v_col = 2LL * p.nk * p.dk;
    const int L = min(C, p.cu[seq + 1] - p.cu[seq] - c0);
    if (j > 0) {
      __syncthreads();  // head j − 1 is done with its v tile, γ, β and Am
      Sm::stage(s.Vs, p, t0, c0, L, v_col + (int64_t)h * p.dv, p.dv);
    }
    if ((gdn_tid() >> 5) == 0) {
      const int lane = gdn_tid() & 31;
      float g0, g1, b0, b1;
      gdn_gate_row(p, t0, L, 2 * lane, h, g0, b0);
      gdn_gate_row(p, t0, L, 2 * lane + 1, h, g1, b1);
      gdn_warp_cumsum(g0, g1);
      s.gam[2 * lane] = g0, s.gam[2 * lane + 1] = g1;
      s.beta[2 * lane] = b0, s.beta[2 * lane + 1] = b1;
    }
    if (j > 0) {  // head 0's v came (and was convolved) with q and k
      gdn_stage_wait();
      if constexpr (CONV) {
        __syncthreads();
        gdn_conv_silu_tiles<D, 1, kSegV>(s.Vs, p, 2, kh, h, L);
      }
    }
    __syncthreads();
    {
      float acc[4][4], accp[4][4];
      gdn_raw_load<LA>(s.raw, acc, accp);
      gdn_scaled_stores(acc, accp, s, p, t0, L, h);
    }
    __syncthreads();
    gdn_solve<LA>(s.Am);
    gdn_wu_scalars<D>(s, s.Vs, p, t0, L, h);
  }
}

// ---- launchers ----

template <int D, bool CONV>
void gdn_chunk_run(const GdnArgs& p, int num_seqs, int max_len, cudaStream_t stream) {
  const int chunks = (max_len + kGdnChunk - 1) / kGdnChunk;
  const int smem = static_cast<int>(GdnChunkSmem<D, CONV>::kKhBytes);
  kernel_smem_opt_in(reinterpret_cast<const void*>(gdn_chunk_kh_kernel<D, CONV>), smem, "gdn_chunk_kh_kernel");
  gdn_chunk_kh_kernel<D, CONV><<<dim3(num_seqs, chunks, p.nk), kGdnChunkThreads, smem, stream>>>(p);
  DF_CUDA_CHECK_LAUNCH("gdn_chunk_kh_kernel");
}

template void gdn_chunk_run<32, false>(const GdnArgs&, int, int, cudaStream_t);
template void gdn_chunk_run<64, false>(const GdnArgs&, int, int, cudaStream_t);
template void gdn_chunk_run<128, false>(const GdnArgs&, int, int, cudaStream_t);
template void gdn_chunk_run<32, true>(const GdnArgs&, int, int, cudaStream_t);
template void gdn_chunk_run<64, true>(const GdnArgs&, int, int, cudaStream_t);
template void gdn_chunk_run<128, true>(const GdnArgs&, int, int, cudaStream_t);

}  // namespace df
