// Causal GQA attention on Hopper warpgroup MMA (wgmma) for head dims 128 and 256: the flash-attention loop
// of attention.cu, but each warpgroup owns 64 query rows and the tensor cores read K and V straight from
// shared memory, so a K/V tile is read from shared memory once per warpgroup instead of once per warp.
// Block = 2 warpgroups = 128 query rows of one head; 64-key tiles, double-buffered with cp.async into the
// 128-byte swizzled layout wgmma reads (kernels/wgmma.cuh). S = Q·Kᵀ with both operands in shared memory;
// O += P·V with P from registers (the S accumulator is the A-fragment layout) and V as a transposed operand.
// Built only for sm_90a (wgmma is arch-specific); the launcher reports whether it ran so the caller can
// fall back to the portable kernel.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda_check.cuh"
#include "kernels/launchers.cuh"
#include "kernels/mma.cuh"
#include "kernels/wgmma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DF_WGMMA_BODY 1
#endif

namespace df {

template <int HD>
struct WgAttnCfg {
  static constexpr int kRows = 128;                          // query rows per block, 64 per warpgroup
  static constexpr int kKeys = 64;                           // keys per tile
  static constexpr int kThreads = 256;
  static constexpr int kTileBytes = 64 * HD * 2;             // one 64-row bf16 tile (Q half, K or V)
  static constexpr int kSmem = 2 * kTileBytes + 4 * kTileBytes + 1024;  // Q, 2 stages of K and V, alignment
  static constexpr int kMinBlocks = HD <= 128 ? 2 : 1;
};

// ---- kernels ----
// Byte offset of 16-byte chunk cc (HD / 8 per row) of row r of a 64-row tile: HD / 64 column blocks of
// 64 rows × 128 bytes, chunk index XOR (row % 8) inside each row: the SWIZZLE_128B layout.
__device__ __forceinline__ uint32_t wg_swizzle(int r, int cc) {
  return static_cast<uint32_t>((cc >> 3) * (64 * 128) + r * 128 + (((cc & 7) ^ (r & 7)) << 4));
}

// Rows [r0, r0 + ROWS) of src (row stride ld) into consecutive 64-row swizzled tiles at dst (shared address);
// rows past len become zeros. One cp.async group per call.
template <int HD, int ROWS>
__device__ __forceinline__ void wg_load_rows(uint32_t dst, const bf16* src, int64_t ld, int r0, int len) {
  constexpr int kChunks = HD / 8;
#pragma unroll
  for (int i = 0; i < ROWS * kChunks / WgAttnCfg<HD>::kThreads; ++i) {
    const int c = threadIdx.x + i * WgAttnCfg<HD>::kThreads;
    const int r = c / kChunks, cc = c % kChunks;
    const bool in = r0 + r < len;
    const uint32_t to = dst + (r >> 6) * WgAttnCfg<HD>::kTileBytes + wg_swizzle(r & 63, cc);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to),
                 "l"(in ? src + (int64_t)(r0 + r) * ld + cc * 8 : src), "r"(in ? 16 : 0));
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int HD>
__global__ void __launch_bounds__(256, WgAttnCfg<HD>::kMinBlocks) attention_causal_sm90_kernel(
    const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v, int64_t ld_v, bf16* out,
    int64_t ld_out, const int32_t* cu, int hq, int hkv, float scale_log2) {
#ifdef DF_WGMMA_BODY
  using Cfg = WgAttnCfg<HD>;
  constexpr int kTile = Cfg::kTileBytes;
  extern __shared__ __align__(16) unsigned char attn90_smem[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(attn90_smem));
  const uint32_t pad = ((raw + 1023u) & ~1023u) - raw;  // swizzled tiles need 1024-byte aligned bases
  unsigned char* base = attn90_smem + pad;
  const uint32_t base_s = raw + pad;
  // Q (two 64-row tiles), then stage s = K at 2 + 2s, V at 3 + 2s (in tiles).

  const int seq = blockIdx.y, head = blockIdx.z;
  const int start = cu[seq], len = cu[seq + 1] - start;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * Cfg::kRows;  // longest (most causal work) tiles first
  if (q0 >= len) return;
  const int kvh = head / (hq / hkv);
  const bf16* ksrc = k + (int64_t)start * ld_k + (int64_t)kvh * HD;
  const bf16* vsrc = v + (int64_t)start * ld_v + (int64_t)kvh * HD;

  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int wg_row0 = q0 + wg * 64;
  const int wg_last = min(wg_row0 + 63, len - 1);  // below wg_row0 when this warpgroup has no valid row
  const int row_a = wg_row0 + warp * 16 + g, row_b = row_a + 8;
  const int ntiles = min(q0 + Cfg::kRows, len) / Cfg::kKeys + (min(q0 + Cfg::kRows, len) % Cfg::kKeys != 0);

  wg_load_rows<HD, 128>(base_s, q + (int64_t)start * ld_q + (int64_t)head * HD, ld_q, q0, len);
  wg_load_rows<HD, 64>(base_s + 2 * kTile, ksrc, ld_k, 0, len);
  wg_load_rows<HD, 64>(base_s + 3 * kTile, vsrc, ld_v, 0, len);

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const unsigned char* qs = base + wg * kTile;

  for (int j = 0; j < ntiles; ++j) {
    const int st = j & 1;
    if (j + 1 < ntiles) {
      wg_load_rows<HD, 64>(base_s + (2 + 2 * (st ^ 1)) * kTile, ksrc, ld_k, (j + 1) * Cfg::kKeys, len);
      wg_load_rows<HD, 64>(base_s + (3 + 2 * (st ^ 1)) * kTile, vsrc, ld_v, (j + 1) * Cfg::kKeys, len);
      asm volatile("cp.async.wait_group 2;\n" ::: "memory");  // all but the two groups just issued
    } else {
      asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    }
    // The copies wrote through the generic proxy; wgmma reads through the async proxy.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    const int k0 = j * Cfg::kKeys;
    if (k0 <= wg_last) {  // uniform per warpgroup, as wgmma requires
      const unsigned char* ks = base + (2 + 2 * st) * kTile;
      const unsigned char* vs = base + (3 + 2 * st) * kTile;
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.0f;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        const int off = (kk >> 2) * (64 * 128) + (kk & 3) * 32;  // column block, then 16 columns inside it
        wgmma_m64n64k16_ss(s, wgmma_desc(qs + off, 16, 1024), wgmma_desc(ks + off, 16, 1024), kk > 0);
      }
      wgmma_commit();
      wgmma_wait_all();
      wgmma_fence_regs(s);

      // Scale, causal mask on the diagonal tile (keys past len are past every valid row), running max.
      // s[i] holds row (i & 2 ? row_b : row_a), key k0 + 8 (i / 4) + 2 t4 + (i & 1).
      const bool diag = k0 + Cfg::kKeys - 1 > wg_row0;
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int col = k0 + 8 * (i >> 2) + 2 * t4 + (i & 1);
        const int h = (i >> 1) & 1;
        const float val = diag && col > (h ? row_b : row_a) ? -INFINITY : s[i] * scale_log2;
        s[i] = val;
        mx[h] = fmaxf(mx[h], val);
      }
      float corr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float m_new = fmaxf(m[h], mx[h]);  // finite: key 0 is visible to every row
        corr[h] = exp2f(m[h] - m_new);
        m[h] = m_new;
        l[h] *= corr[h];
      }
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const float p = exp2f(s[i] - m[(i >> 1) & 1]);
        s[i] = p;
        l[(i >> 1) & 1] += p;
      }
      if (corr[0] != 1.0f || corr[1] != 1.0f) {
#pragma unroll
        for (int i = 0; i < HD / 2; ++i) o[i] *= corr[(i >> 1) & 1];
      }

      // P as bf16 A fragments, 16 keys per k-step; V rows of the k-step are 2 swizzle atoms (1024 bytes
      // apart), its HD columns HD / 64 column blocks (64 rows × 128 bytes apart).
      uint32_t p[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        p[kk][0] = pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
        p[kk][1] = pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
        p[kk][2] = pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
        p[kk][3] = pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if constexpr (HD == 256)
          wgmma_m64n256k16_rs_tb(o, p[kk], wgmma_desc(vs + kk * 2048, 64 * 128, 1024));
        else
          wgmma_m64n128k16_rs_tb(o, p[kk], wgmma_desc(vs + kk * 2048, 64 * 128, 1024));
      }
      wgmma_commit();
      wgmma_wait_all();
      wgmma_fence_regs(o);
    }
    __syncthreads();  // every warpgroup is done with stage st before the next iteration refills it
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    l[h] = 1.0f / l[h];
  }
  bf16* out_a = out + (int64_t)(start + row_a) * ld_out + (int64_t)head * HD;
  bf16* out_b = out_a + 8 * ld_out;
#pragma unroll
  for (int i = 0; i < HD / 2; i += 4) {
    const int d = 8 * (i >> 2) + 2 * t4;
    if (row_a < len)
      *reinterpret_cast<__nv_bfloat162*>(out_a + d) = __floats2bfloat162_rn(o[i] * l[0], o[i + 1] * l[0]);
    if (row_b < len)
      *reinterpret_cast<__nv_bfloat162*>(out_b + d) = __floats2bfloat162_rn(o[i + 2] * l[1], o[i + 3] * l[1]);
  }
#endif
}

// ---- launchers ----
template <int HD>
static void attention_causal_sm90_run(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                      int64_t ld_v, bf16* out, int64_t ld_out, const int32_t* cu, int num_seqs,
                                      int max_len, int hq, int hkv, float scale, cudaStream_t stream) {
  using Cfg = WgAttnCfg<HD>;
  DF_CUDA_CHECK(cudaFuncSetAttribute(attention_causal_sm90_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     Cfg::kSmem));
  dim3 grid((max_len + Cfg::kRows - 1) / Cfg::kRows, num_seqs, hq);
  attention_causal_sm90_kernel<HD><<<grid, Cfg::kThreads, Cfg::kSmem, stream>>>(
      q, ld_q, k, ld_k, v, ld_v, out, ld_out, cu, hq, hkv, scale * 1.4426950408889634f);
  DF_CUDA_CHECK_LAUNCH("attention_causal_sm90_kernel");
}

// True when this build has sm_90a code and the current GPU is compute capability 9.0 (read once per
// device); DFLASH_ATTN=mma turns the path off, for A/B measurements.
static bool attention_sm90_available() {
#ifdef DF_CUDA_SM90A
  static const bool disabled = [] {
    const char* e = std::getenv("DFLASH_ATTN");
    return e && std::strcmp(e, "mma") == 0;
  }();
  if (disabled) return false;
  static int cached[64];  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  DF_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return false;
  if (cached[dev] == 0) {
    int major = 0, minor = 0;
    DF_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    DF_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    cached[dev] = major == 9 && minor == 0 ? 1 : 2;
  }
  return cached[dev] == 1;
#else
  return false;
#endif
}

bool attention_causal_sm90_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                  int64_t ld_v, bf16* out, int64_t ld_out, const int32_t* cu, int num_seqs,
                                  int max_len, int hq, int hkv, int hd, float scale, cudaStream_t stream) {
  auto al16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool shape_ok = (hd == 128 || hd == 256) && ld_q % 8 == 0 && ld_k % 8 == 0 && ld_v % 8 == 0 &&
                        ld_out % 2 == 0 && al16(q) && al16(k) && al16(v) &&
                        reinterpret_cast<uintptr_t>(out) % 4 == 0;
  if (!shape_ok || !attention_sm90_available()) return false;
  if (hd == 256)
    attention_causal_sm90_run<256>(q, ld_q, k, ld_k, v, ld_v, out, ld_out, cu, num_seqs, max_len, hq, hkv, scale,
                                   stream);
  else
    attention_causal_sm90_run<128>(q, ld_q, k, ld_k, v, ld_v, out, ld_out, cu, num_seqs, max_len, hq, hkv, scale,
                                   stream);
  return true;
}

}  // namespace df
