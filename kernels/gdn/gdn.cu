// Gated DeltaNet chunked prefill (UT/WY form, chunk 64) in two kernels, so the sequential part is short.
// Per chunk (γ = cumsum g, Γ_ij = e^(γ_i − γ_j), A = strictly_lower(β K Kᵀ ⊙ Γ), T = (I + A)⁻¹):
//   W = T (β e^γ K),  U = T (β V),  V' = U − W S,  O = (Q ⊙ e^γ) S + lower_incl(Q Kᵀ ⊙ Γ) V',
//   S = e^(γ_C) S + (K ⊙ e^(γ_C − γ))ᵀ V'.
// The chunk kernel (gdn_chunk.cu) does everything that does not depend on S for every (chunk, value head) at
// once (T by 16×16 diagonal blocks and block rows of off-diagonal tensor-core products) and leaves W, U and
// the masked scores as bf16 rows of a workspace indexed by token. gdn_state_kernel then walks each (sequence,
// value head) with all of S in fp32 registers from a zero start, so no state crosses a sequence boundary.
// Gates, norms, T and S stay fp32; every product runs on bf16 tensor cores with fp32 accumulation, the fp32
// operands (T, S, V') split into bf16 hi + lo so they keep 16 mantissa bits. Row strides are padded so
// ldmatrix rows spread over all banks. The fused form (gdn_mixer_launch, the whole DeltaNet mixer of a layer)
// reads the projection before the causal conv and runs conv + SiLU on the chunk kernel's tiles, and the gated
// RMSNorm in the state kernel's epilogue, so neither the conv output nor the un-normed output makes a round
// trip through memory.
#include <cmath>
#include <cstdio>

#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/dispatch/dispatch.h"
#include "kernels/gdn/gdn.cuh"
#include "kernels/launchers.cuh"
#include "kernels/primitives/mma.cuh"

namespace df {

// ---- kernels ----

// One state-pass pipeline stage: W, Q, K, U (and in the fused form the gate Z) tiles [C][kLdB], the masked
// scores [C][kLdP] (bf16) and the row scalars [C] of one chunk. STAGES 2: the next chunk's copies fly while
// this one is computed. STAGES 1 (devices with 99 KB a block, where two stages of 128-wide tiles do not fit):
// W and Q are refilled for the next chunk once the first products (S Wᵀ, S Qᵀ) have read them, so their
// copies fly behind this chunk's V', O and S-update products; the other tiles once the chunk is done, behind
// the next chunk's first products. Same tiles, same 64-token chunk (the workspace's score rows) and S still
// wholly in registers, so every product keeps its mma.sync shape; only the copies are less ahead. The fused
// form's norm adds per-warp sums of squares [warps][C] and r [C] after the stages.
template <int D, bool NORM, int STAGES>
struct GdnStateSmem {
  static constexpr int C = kGdnChunk, kLdB = D + 8, kLdP = C + 8, kTiles = NORM ? 5 : 4, kWarps = D / 16;
  static constexpr size_t kTileBytes = sizeof(bf16) * (kTiles * C * kLdB + C * kLdP);
  static constexpr size_t kStage = kTileBytes + sizeof(float4) * C;
  static constexpr size_t kBytes = gdn_state_smem_bytes(D, NORM, STAGES);
  static_assert(kTileBytes % 16 == 0, "row scalars must stay 16-byte aligned");
  static_assert(kStage == gdn_state_stage_bytes(D, NORM) &&
                    kBytes == STAGES * kStage + (NORM ? sizeof(float) * (kWarps + 1) * C : 0),
                "gdn_state_smem_bytes (what dispatch weighs) is this layout's size");
  static_assert(STAGES == 2 || kBytes <= kSmemOptinLeast,
                "the one-stage form fits every device's shared memory");
};

// One block per (value head, sequence) walks the chunks with all of S: warp w keeps Sᵀ rows [16w, 16w + 16)
// (value columns × key dim) in fp32 registers in the MMA accumulator layout, which is also the A-fragment
// layout of the products that read S, so S never touches shared memory. Every product is transposed
// (value columns as M): V'ᵀ = Uᵀ − Sᵀ Wᵀ, Oᵀ = (Sᵀ Qᵀ) ⊙ qs + V'ᵀ Pᵀ, Sᵀ = e^(γ_C) Sᵀ + (V' ⊙ kd)ᵀ K, with
// the bf16 tiles as B fragments straight from ldmatrix. In the recurrence (V' and the S update) the fp32 side
// (S, V') is split into bf16 hi + lo, because an error there is carried into every later chunk. The two
// output products take the hi half only: their error (2^-9 relative per term, as in flash-linear-attention,
// which rounds S to bf16 for every product) stays in this chunk's O, which is rounded to bf16 anyway.
// CONV: the conv'd q and k rows are those the chunk kernel left in p.qk. NORM: the gated RMSNorm is applied
// to the fp32 O before its only rounding. STAGES: GdnStateSmem; both forms do the same arithmetic in the same
// order, so they give the same bits.
template <int D, bool CONV, bool NORM, int STAGES>
__global__ void __launch_bounds__(2 * D, 1) gdn_state_kernel(const GdnArgs p) {
  static_assert(STAGES == 1 || STAGES == 2, "one or two pipeline stages");
  using Sm = GdnStateSmem<D, NORM, STAGES>;
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
  // Chunk c's copies into `stage`, uncommitted: W and Q (the first products' operands), then the rest.
  auto load_wq = [&](int c, int stage) {
    const int L = min(C, len - c * C);
    const int64_t t0 = start + (int64_t)c * C;
    const bf16* row0 = qk + t0 * ld_qk;
    gdn_stage<D, NTHR>(tile(stage, 0), LB, p.ws_w + (t0 * nv + h) * D, (int64_t)nv * D, 0, L, D);
    gdn_stage<D, NTHR>(tile(stage, 1), LB, row0 + (int64_t)kh * dk, ld_qk, 0, L, dk);
  };
  auto load_rest = [&](int c, int stage) {
    const int L = min(C, len - c * C);
    const int64_t t0 = start + (int64_t)c * C;
    const bf16* row0 = qk + t0 * ld_qk;
    gdn_stage<D, NTHR>(tile(stage, 2), LB, row0 + (int64_t)(nk + kh) * dk, ld_qk, 0, L, dk);
    gdn_stage<D, NTHR>(tile(stage, 3), LB, p.ws_u + (t0 * nv + h) * D, (int64_t)nv * D, 0, L, D);
    if constexpr (NORM)
      gdn_stage<D, NTHR>(tile(stage, 4), LB, p.z + t0 * p.ld_z + (int64_t)h * dv, p.ld_z, 0, L, dv);
    gdn_stage<C, NTHR>(scores(stage), LP, p.ws_p + (t0 * nv + h) * C, (int64_t)nv * C, 0, L, C);
    float4* sc = scalars(stage);
    for (int r = threadIdx.x; r < C; r += NTHR) {
      uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(sc + r));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
                   "l"(r < L ? p.ws_s + (t0 + r) * nv + h : p.ws_s), "r"(r < L ? 16 : 0));
    }
  };

  float st[NS][4];
  gdn_warp_zero(st);
  float norm_w[2] = {0.0f, 0.0f};  // the gated norm's weights of this lane's value columns v0 + g (+ 8)
  if constexpr (NORM)
#pragma unroll
    for (int e = 0; e < 2; ++e) norm_w[e] = v0 + g + 8 * e < dv ? p.norm_w[v0 + g + 8 * e] : 0.0f;
  // Copy groups in flight at the top of chunk c: STAGES 2, chunk c's; STAGES 1, its W | Q, then the rest.
  if (chunks > 0) {
    load_wq(0, 0);
    if constexpr (STAGES == 1) cp_async_commit();
    load_rest(0, 0);
    cp_async_commit();
  }
  for (int c = 0; c < chunks; ++c) {
    if constexpr (STAGES == 2) {
      if (c + 1 < chunks) {
        load_wq(c + 1, (c + 1) & 1);
        load_rest(c + 1, (c + 1) & 1);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
    } else {
      cp_async_wait<1>();  // W and Q; the rest may still be in flight
    }
    __syncthreads();  // chunk c's tiles (STAGES 1: W and Q) are visible to every warp
    const int stage = STAGES == 2 ? c & 1 : 0, L = min(C, len - c * C);
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
    if constexpr (STAGES == 1) {
      cp_async_wait<0>();
      __syncthreads();  // chunk c's other tiles are visible, and every warp is done with W and Q
      if (c + 1 < chunks) {
        load_wq(c + 1, 0);
        cp_async_commit();
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
      float* ssq = reinterpret_cast<float*>(gdn_state_smem + STAGES * Sm::kStage);  // [warps][C]
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
    __syncthreads();  // every warp is done with this stage before chunk c + STAGES is copied into it
    if constexpr (STAGES == 1) {
      if (c + 1 < chunks) {
        load_rest(c + 1, 0);
        cp_async_commit();
      }
    }
  }
}

// ---- launchers ----

template <int D, bool CONV, bool NORM, int STAGES>
static void gdn_state_run(const GdnArgs& p, int num_seqs, cudaStream_t stream) {
  const size_t smem = GdnStateSmem<D, NORM, STAGES>::kBytes;
  const char* what = STAGES == 2 ? "gdn_state_kernel (two stages)" : "gdn_state_kernel (one stage)";
  kernel_smem_opt_in(reinterpret_cast<const void*>(gdn_state_kernel<D, CONV, NORM, STAGES>), smem, what);
  gdn_state_kernel<D, CONV, NORM, STAGES><<<dim3(p.nv, num_seqs), 2 * D, smem, stream>>>(p);
  DF_CUDA_CHECK_LAUNCH("gdn_state_kernel");
}

template <int D, bool CONV, bool NORM>
static void gdn_prefill_run(GdnArgs p, int num_seqs, int64_t T, int max_len, unsigned char* ws,
                            cudaStream_t stream) {
  const GdnWorkspaceLayout l = gdn_prefill_workspace_layout(T, p.nv, p.dk, p.dv);
  p.ws_w = reinterpret_cast<bf16*>(ws + l.w);
  p.ws_u = reinterpret_cast<bf16*>(ws + l.u);
  p.ws_p = reinterpret_cast<bf16*>(ws + l.scores);
  p.ws_s = reinterpret_cast<float4*>(ws + l.scalars);
  gdn_chunk_run<D, CONV>(p, num_seqs, max_len, stream);
  const size_t two_stage = GdnStateSmem<D, NORM, 2>::kBytes;
  if (gdn_state_kernel_choose(device_caps(), kernel_variants(), two_stage) == GdnStateKernel::two_stage)
    gdn_state_run<D, CONV, NORM, 2>(p, num_seqs, stream);
  else
    gdn_state_run<D, CONV, NORM, 1>(p, num_seqs, stream);
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

// Whether the chunked kernels run (gdn_prefill_kernel_choose): a layout they read, unless the registry's
// gdn=recurrent sends every prefill to the fp32 token recurrence (decode.cu), so that the golden tests can
// tell how much of a model's bf16 error the chunked form's roundings add.
static bool gdn_chunked(const bf16* qkv, int64_t ld_qkv, const bf16* out, int64_t ld_out, int num_seqs, int nk,
                        int nv, int dk, int dv) {
  const bool layout = gdn_prefill_chunked_shape(dk, dv) && nk > 0 && nv % nk == 0 && ld_qkv % 8 == 0 &&
                      ld_out % 2 == 0 && reinterpret_cast<uintptr_t>(qkv) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(out) % 4 == 0 && num_seqs <= 65535 && nv <= 65535;
  return gdn_prefill_kernel_choose(kernel_variants(), layout) == GdnPrefillKernel::chunked;
}

void gdn_prefill_launch(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b,
                        int64_t ld_b, const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out,
                        const int32_t* cu, int num_seqs, int64_t T, int max_len, int nk, int nv, int dk,
                        int dv, void* ws, size_t ws_bytes, cudaStream_t stream) {
  if (num_seqs == 0 || nv == 0 || T == 0 || max_len == 0) return;
  // The token recurrence (decode.cu): any dims, no workspace.
  if (!gdn_chunked(qkv, ld_qkv, out, ld_out, num_seqs, nk, nv, dk, dv))
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
  const bool fused = conv_k == kGdnConvTaps && gdn_chunked(x, ld_x, out, ld_out, num_seqs, nk, nv, dk, dv) &&
                     ld_z % 8 == 0 && ld_conv % 8 == 0 && ld_o % 2 == 0 && al(z, 16) && al(conv, 16) && al(o, 4);
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
  p.z = z, p.ld_z = ld_z, p.norm_w = norm_w, p.eps = eps, p.out = out, p.ld_out = ld_out;
  gdn_prefill_dispatch<true, true>(p, num_seqs, T, max_len, ws, ws_bytes, stream);
}

}  // namespace df
