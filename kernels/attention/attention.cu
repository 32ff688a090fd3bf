// Causal GQA attention over packed variable-length sequences, flash style: one block = 64 queries of one
// head (128 at hd 256), one warp per 16 rows, walking 64-key tiles (32 where those do not fit the device's
// shared memory: attention_portable_keys_choose) with an online softmax in fp32 (exp2 with log2e folded into
// the scale). Q·Kᵀ and P·V run on bf16 tensor cores (mma.sync m16n8k16, fp32 accumulate); P is rounded to
// bf16 before P·V as in FlashAttention. Head dims are padded with zeros to 16/32/64/128/256 in shared memory.
// An optional output gate (gated attention) is applied in the epilogue, saving a pass over the output.
// attention_causal_launch picks between this project's kernels (this one, attention_sm90.cu's wgmma kernel,
// the general one) and cuDNN's fused attention (cudnn_sdpa.cu) by measuring both at a shape class's first
// call.
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>

#include "kernels/dispatch/dispatch.h"
#include "kernels/dispatch/measured.h"
#include "kernels/launchers.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/primitives/mma.cuh"
#ifdef DF_HAVE_CUDNN
#include "kernels/attention/cudnn_sdpa.h"
#endif

namespace df {

// Queries per block: attention_portable_rows (kernels/dispatch/dispatch.h says why).
template <int HD>
struct AttnCfg {
  static constexpr int kRows = attention_portable_rows(HD);
  static constexpr int kThreads = kRows * 2;  // 16 rows per warp
};

// ---- kernels ----
// Rows [r0, r0 + ROWS) of one head into shared memory (row stride LDS), zeros past len and past hd, as
// 16-byte cp.async copies committed as one group; they complete at the next attn_wait.
template <int HD, int LDS, int ROWS>
__device__ __forceinline__ void attn_load_tile(bf16* dst, const bf16* src, int64_t ld, int r0, int len, int hd) {
  constexpr int kChunks = HD / 8;
  for (int c = threadIdx.x; c < ROWS * kChunks; c += AttnCfg<HD>::kThreads) {
    int r = c / kChunks, d = (c % kChunks) * 8;
    bool in = r0 + r < len && d < hd;
    uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(dst + r * LDS + d));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to),
                 "l"(in ? src + (int64_t)(r0 + r) * ld + d : src), "r"(in ? 16 : 0));
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Every committed copy of this thread is done; the barrier makes all of them visible to the block.
__device__ __forceinline__ void attn_wait() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
}

// K and V of a tile (KEYS keys) have buffers of their own, so the copy of V(j) flies during Q·K(j)ᵀ and the
// copy of K(j+1) during P·V(j).
template <int HD, int KEYS>
__global__ void __launch_bounds__(AttnCfg<HD>::kThreads)
    attention_causal_kernel(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                            int64_t ld_v, bf16* out, int64_t ld_out, const bf16* gate, int64_t ld_gate,
                            const int32_t* cu, int hq, int hkv, int hd, float scale_log2) {
  constexpr int LDS = HD + 8;  // +16 bytes per row: the 8 rows of an ldmatrix hit 8 different bank groups
  constexpr int kRows = AttnCfg<HD>::kRows;
  extern __shared__ __align__(16) unsigned char attn_smem[];
  bf16* Qs = reinterpret_cast<bf16*>(attn_smem);
  bf16* Ks = Qs + kRows * LDS;
  bf16* Vs = Ks + KEYS * LDS;

  const int seq = blockIdx.y, head = blockIdx.z;
  const int start = cu[seq], len = cu[seq + 1] - start;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows;  // longest (most causal work) tiles first
  if (q0 >= len) return;
  const int kvh = head / (hq / hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const bf16* ksrc = k + (int64_t)start * ld_k + (int64_t)kvh * hd;
  const bf16* vsrc = v + (int64_t)start * ld_v + (int64_t)kvh * hd;

  attn_load_tile<HD, LDS, kRows>(Qs, q + (int64_t)start * ld_q + (int64_t)head * hd, ld_q, q0, len, hd);
  attn_load_tile<HD, LDS, KEYS>(Ks, ksrc, ld_k, 0, len, hd);

  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  const int row_a = q0 + warp * 16 + g, row_b = row_a + 8;  // the two query rows this thread holds
  const int last_key = min(q0 + kRows - 1, len - 1);

  for (int k0 = 0; k0 <= last_key; k0 += KEYS) {
    attn_wait();  // K(k0) (and Q) arrived; every warp is done with P·V of the previous tile
    attn_load_tile<HD, LDS, KEYS>(Vs, vsrc, ld_v, k0, len, hd);

    float s[KEYS / 8][4];
    warp_mma_abt<KEYS / 8, HD, LDS>(s, Qs + warp * 16 * LDS, Ks, lane);

    // Scale, causal mask (keys past len are also past every valid row), running max.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < KEYS / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int col = k0 + n * 8 + 2 * t4 + (e & 1);
        int row = e < 2 ? row_a : row_b;
        float val = col > row ? -INFINITY : s[n][e] * scale_log2;
        s[n][e] = val;
        mx[e >> 1] = fmaxf(mx[e >> 1], val);
      }
    }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      float m_new = fmaxf(m[r], mx[r]);  // finite: key 0 of the first tile is visible to every row
      corr[r] = exp2f(m[r] - m_new);
      m[r] = m_new;
      l[r] *= corr[r];
    }
#pragma unroll
    for (int n = 0; n < KEYS / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = exp2f(s[n][e] - m[e >> 1]);
        s[n][e] = p;
        l[e >> 1] += p;
      }
    }
    scale_acc_rows(o, corr[0], corr[1]);

    attn_wait();  // V(k0) arrived; every warp is done with Q·K(k0)ᵀ
    if (k0 + KEYS <= last_key) attn_load_tile<HD, LDS, KEYS>(Ks, ksrc, ld_k, k0 + KEYS, len, hd);

      // O += P·V: the S accumulator layout is the A-fragment layout of the next MMA (two n-tiles per k-step).
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; ++kk) {
      uint32_t a[4];
      acc_to_a_frag(s[2 * kk], s[2 * kk + 1], a);
      warp_mma_ab<HD / 8, LDS>(o, a, Vs + kk * 16 * LDS, lane);
    }
  }

  attn_store_rows<HD>(o, l, out, ld_out, gate, ld_gate, start, len, row_a, head, hd);
}

// ---- launchers ----
template <int HD>
static void attention_causal_run(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                 int64_t ld_v, bf16* out, int64_t ld_out, const bf16* gate, int64_t ld_gate,
                                 const int32_t* cu, int num_seqs, int max_len, int hq, int hkv, int hd, float scale,
                                 cudaStream_t stream) {
  constexpr int kRows = AttnCfg<HD>::kRows;
  auto run = [&](auto keys) {
    constexpr int KEYS = decltype(keys)::value;
    const size_t smem = attention_portable_smem(HD, KEYS);
    kernel_smem_opt_in(reinterpret_cast<const void*>(attention_causal_kernel<HD, KEYS>), smem,
                       "attention_causal_kernel");
    dim3 grid((max_len + kRows - 1) / kRows, num_seqs, hq);
    attention_causal_kernel<HD, KEYS><<<grid, AttnCfg<HD>::kThreads, smem, stream>>>(
        q, ld_q, k, ld_k, v, ld_v, out, ld_out, gate, ld_gate, cu, hq, hkv, hd, scale * 1.4426950408889634f);
    DF_CUDA_CHECK_LAUNCH("attention_causal_kernel");
  };
  if (attention_portable_keys_choose(device_caps(), kernel_variants(), HD) == 64)
    run(std::integral_constant<int, 64>{});
  else
    run(std::integral_constant<int, 32>{});
}

bool attention_cudnn_available(std::string* why) {
#ifdef DF_HAVE_CUDNN
  return cudnn_sdpa_usable(why);
#else
  if (why)
    *why = "this build has no cuDNN (CMake found no cuDNN 9 in the CUDA toolkit, or DF_ENABLE_CUDNN=OFF)";
  return false;
#endif
}

void attention_causal_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v, int64_t ld_v,
                             bf16* out, int64_t ld_out, const bf16* gate, int64_t ld_gate, const int32_t* cu,
                             int num_seqs, int64_t tokens, int max_len, int hq, int hkv, int hd, float scale,
                             cudaStream_t stream) {
  if (num_seqs == 0 || max_len == 0) return;
  // The tiled kernels copy q/k/v rows in 16-byte pieces and store the output as bf16 pairs.
  auto al = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  bool ok = hd % 8 == 0 && hd <= 256 && hkv > 0 && hq % hkv == 0 && ld_q % 8 == 0 && ld_k % 8 == 0 &&
            ld_v % 8 == 0 && ld_out % 2 == 0 && al(q, 16) && al(k, 16) && al(v, 16) && al(out, 4);
  if (!ok)  // a shape or layout the tiled kernels are not built for: the general kernel (decode.cu), slower
    return attention_causal_general_launch(q, ld_q, k, ld_k, v, ld_v, out, ld_out, gate, ld_gate, cu, num_seqs,
                                           tokens, hq, hkv, hd, scale, stream);
  // The epilogues read the gate as bf16 pairs; a gate view they cannot read that way is applied by the
  // separate sigmoid_gate kernel instead (the same bits, one more pass).
  const bool gate_pairs = ld_gate % 2 == 0 && reinterpret_cast<uintptr_t>(gate) % 4 == 0;
  const bf16* fused_gate = gate && gate_pairs ? gate : nullptr;
  auto ours = [&] {
    if (!attention_causal_sm90_launch(q, ld_q, k, ld_k, v, ld_v, out, ld_out, fused_gate, ld_gate, cu,
                                      num_seqs, tokens, max_len, hq, hkv, hd, scale, stream)) {
      dispatch_head_dim(hd, [&](auto pad) {
        attention_causal_run<decltype(pad)::value>(q, ld_q, k, ld_k, v, ld_v, out, ld_out, fused_gate,
                                                   ld_gate, cu, num_seqs, max_len, hq, hkv, hd, scale,
                                                   stream);
      });
    }
    if (gate && !fused_gate)
      sigmoid_gate_launch(out, ld_out, gate, ld_gate, tokens, (int64_t)hq * hd, stream);
  };
  // cuDNN writes whole 16-byte rows and has no gate epilogue: the gate is the separate pass.
  auto cudnn = [&] {
#ifdef DF_HAVE_CUDNN
    cudnn_sdpa_launch(q, ld_q, k, ld_k, v, ld_v, out, ld_out, cu, num_seqs, max_len, hq, hkv, hd, scale,
                      stream);
    if (gate) sigmoid_gate_launch(out, ld_out, gate, ld_gate, tokens, (int64_t)hq * hd, stream);
#else
    kernel_throw(__FILE__, __LINE__, "attention: this build has no cuDNN");
#endif
  };
  const KernelVariants& variants = kernel_variants();
  std::string why;
  // cuDNN is a candidate at head dims that are multiples of 64 (the models here use 128 and 256; the tests'
  // smaller and odd head dims stay on ours) with 16-byte output rows.
  const bool cudnn_layout = hd % 64 == 0 && ld_out % 8 == 0 && al(out, 16);
  const bool cudnn_ok = cudnn_layout && attention_cudnn_available(&why);
  if (!cudnn_layout)
    why =
        "cuDNN takes head dims that are multiples of 64 and output rows 16-byte aligned with a row stride "
        "that is a multiple of 8 (head dim " +
        std::to_string(hd) + ", row stride " + std::to_string(ld_out) + ")";
  // The shape class of the measured choice: heads, head dim, and the powers of two of the longest sequence
  // and of the token count (what the two implementations' relative speed depends on). The gate is left out,
  // so gated and ungated calls of a shape run the same implementation and a gated output is always the
  // ungated one's bits through the gate.
  std::string key;
  int measured = -1;
  bool capturing = false;
  if (cudnn_ok && !variants.attention_cudnn) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DF_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    capturing = capture != cudaStreamCaptureStatusNone;
    char buf[192];
    std::snprintf(buf, sizeof buf,
                  "prefill attention %d/%d heads of %d, longest sequence <= %lld, tokens <= %lld%s%s", hq,
                  hkv, hd, (long long)pow2_bucket(max_len, 64), (long long)pow2_bucket(tokens, 64),
                  device_caps().profile.empty() ? "" : ", profile ", device_caps().profile.c_str());
    key = buf;
    measured = measured_pick(key);
  }
  switch (attention_impl_choose(variants, cudnn_ok, capturing, measured)) {
    case AttentionImpl::ours:
      return ours();
    case AttentionImpl::cudnn:
      if (!cudnn_ok)
        kernel_throw(__FILE__, __LINE__,
                     "DFLASH_KERNEL_VARIANTS=attention=cudnn, but cuDNN cannot serve this call: " + why);
      return cudnn();
    case AttentionImpl::measure:
      // The kept form runs once more after the measurement, so every call of the class computes its output
      // with the same implementation.
      if (measured_choose(key, {{"ours", ours}, {"cudnn", cudnn}}, stream) == 1) return cudnn();
      return ours();
  }
}

}  // namespace df
