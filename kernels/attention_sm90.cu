// Causal GQA attention on Hopper warpgroup MMA (wgmma) for head dims 128 and 256: the flash-attention loop
// of attention.cu, but each warpgroup owns 64 query rows and the tensor cores read K and V straight from
// shared memory, so a K/V tile is read from shared memory once per warpgroup instead of once per warp.
// Block = 2 warpgroups = 128 query rows of one head; 64-key tiles in 2 stages, loaded by TMA into the
// 128-byte swizzled layout wgmma reads (kernels/wgmma.cuh) and tracked by mbarriers, so the warpgroups only
// wait for the data they use and may run up to a tile apart (one's softmax overlaps the other's MMAs).
// S = Q·Kᵀ with both operands in shared memory; O += P·V with P from registers (the S accumulator is the
// A-fragment layout) and V as a transposed operand. Built only for sm_90a (wgmma is arch-specific); the
// launcher reports whether it ran so the caller can fall back to the portable kernel. An optional output
// gate (gated attention) is applied in the epilogue, as in attention.cu.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"
#include "kernels/mma.cuh"
#include "kernels/wgmma.cuh"

namespace df {

template <int HD>
struct WgAttnCfg {
  static constexpr int kRows = 128;  // query rows per block, 64 per warpgroup
  static constexpr int kKeys = 64;   // keys per tile
  static constexpr int kThreads = 256;
  static constexpr int kTileBytes = 64 * HD * 2;  // one 64-row bf16 tile (Q half, K or V)
  // Q (2 tiles), 2 stages of K and V, 5 mbarriers, slack to align the base to 1024 bytes.
  static constexpr int kSmem = 6 * kTileBytes + 64 + 1024;
  static constexpr int kMinBlocks = HD <= 128 ? 2 : 1;
};

// ---- kernels ----
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// The producer's arrival, announcing the bytes the TMA copies will deliver to this phase.
__device__ __forceinline__ void mbar_arrive_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// A 64-row × HD tile at (row, col0) of the tensor behind tm: HD / 64 boxes of 64 × 64 (128 bytes wide, the
// swizzle span), each landing as one 8 KB column block. Rows past the tensor's end arrive as zeros.
template <int HD>
__device__ __forceinline__ void tma_load_tile(uint32_t dst, const CUtensorMap* tm, int col0, int row,
                                              uint32_t bar) {
#pragma unroll
  for (int b = 0; b < HD / 64; ++b)
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(dst + b * 64 * 128),
        "l"(tm), "r"(col0 + b * 64), "r"(row), "r"(bar)
        : "memory");
}

template <int HD>
__global__ void __launch_bounds__(256, WgAttnCfg<HD>::kMinBlocks)
    attention_causal_sm90_kernel(const __grid_constant__ CUtensorMap tm_q,
                                 const __grid_constant__ CUtensorMap tm_k,
                                 const __grid_constant__ CUtensorMap tm_v, bf16* out, int64_t ld_out,
                                 const bf16* gate, int64_t ld_gate, const int32_t* cu, int hq, int hkv,
                                 float scale_log2) {
#ifdef DF_WGMMA_BODY
  using Cfg = WgAttnCfg<HD>;
  constexpr int kTile = Cfg::kTileBytes;
  extern __shared__ __align__(16) unsigned char attn90_smem[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(attn90_smem));
  const uint32_t pad = ((raw + 1023u) & ~1023u) - raw;  // swizzled tiles need 1024-byte aligned bases
  unsigned char* base = attn90_smem + pad;
  const uint32_t base_s = raw + pad;
  // Tiles: Q at 0 and 1, stage s: K at 2 + 2s, V at 3 + 2s. Then the mbarriers: Q full, K/V full per
  // stage (TMA bytes), K/V empty per stage (every thread arrives once it is done reading the stage).
  const uint32_t bar_q = base_s + 6 * kTile;
  auto bar_full = [&](int st) { return bar_q + 8 + 8 * st; };
  auto bar_empty = [&](int st) { return bar_q + 24 + 8 * st; };

  const int seq = blockIdx.y, head = blockIdx.z;
  const int start = cu[seq], len = cu[seq + 1] - start;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * Cfg::kRows;  // longest (most causal work) tiles first
  if (q0 >= len) return;
  const int kv_col = head / (hq / hkv) * HD;
  const bool producer = threadIdx.x == 0;
  const int end = min(q0 + Cfg::kRows, len);
  const int ntiles = (end + Cfg::kKeys - 1) / Cfg::kKeys;

  if (producer) {
    mbar_init(bar_q, 1);
    for (int st = 0; st < 2; ++st) {
      mbar_init(bar_full(st), 1);
      mbar_init(bar_empty(st), Cfg::kThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (producer) {
    mbar_arrive_expect(bar_q, 2 * kTile);
    tma_load_tile<HD>(base_s, &tm_q, head * HD, start + q0, bar_q);
    tma_load_tile<HD>(base_s + kTile, &tm_q, head * HD, start + q0 + 64, bar_q);
    mbar_arrive_expect(bar_full(0), 2 * kTile);
    tma_load_tile<HD>(base_s + 2 * kTile, &tm_k, kv_col, start, bar_full(0));
    tma_load_tile<HD>(base_s + 3 * kTile, &tm_v, kv_col, start, bar_full(0));
  }

  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int wg_row0 = q0 + wg * 64;
  const int wg_last = min(wg_row0 + 63, len - 1);  // below wg_row0 when this warpgroup has no valid row
  const int row_a = wg_row0 + warp * 16 + g, row_b = row_a + 8;

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const unsigned char* qs = base + wg * kTile;
  mbar_wait(bar_q, 0);

  for (int j = 0; j < ntiles; ++j) {
    const int st = j & 1;
    if (producer && j + 1 < ntiles) {  // refill the other stage once every thread is done with tile j − 1
      if (j >= 1) mbar_wait(bar_empty(st ^ 1), ((j - 1) >> 1) & 1);
      mbar_arrive_expect(bar_full(st ^ 1), 2 * kTile);
      tma_load_tile<HD>(base_s + (2 + 2 * (st ^ 1)) * kTile, &tm_k, kv_col, start + (j + 1) * Cfg::kKeys,
                        bar_full(st ^ 1));
      tma_load_tile<HD>(base_s + (3 + 2 * (st ^ 1)) * kTile, &tm_v, kv_col, start + (j + 1) * Cfg::kKeys,
                        bar_full(st ^ 1));
    }
    mbar_wait(bar_full(st), (j >> 1) & 1);

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

      // Causal mask on the diagonal tile only (keys past len, whether zeros or the next sequence's, are past
      // every valid row), then the running max of the raw scores; the scale goes into the exponent's FFMA
      // (scale > 0, so the max commutes with it), which keeps the common off-diagonal tile to a max, one
      // FFMA and one ex2 per score. s[i] holds row (i & 2 ? row_b : row_a),
      // key k0 + 8 (i / 4) + 2 t4 + (i & 1).
      if (k0 + Cfg::kKeys - 1 > wg_row0) {
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int col = k0 + 8 * (i >> 2) + 2 * t4 + (i & 1);
          if (col > (i & 2 ? row_b : row_a)) s[i] = -INFINITY;
        }
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int i = 0; i < 32; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
      float corr[2], neg_m[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float m_new = fmaxf(m[h], mx[h] * scale_log2);  // finite: key 0 is visible to every row
        corr[h] = exp2f(m[h] - m_new);
        m[h] = m_new;
        neg_m[h] = -m_new;
        l[h] *= corr[h];
      }
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const float p = exp2f(fmaf(s[i], scale_log2, neg_m[(i >> 1) & 1]));
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
    mbar_arrive(bar_empty(st));
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    l[h] = 1.0f / l[h];
  }
  // Row a, then row b: half of o is dead by the time row b is written, which keeps the HD 128 kernel inside
  // its 128 registers with a gate. A row's gate pairs are all loaded before its first store: the stores
  // could alias the gate as far as the compiler knows, so loads interleaved with them would each wait a
  // full memory round trip.
  auto store_row = [&](bf16* dst, const bf16* gate_row, int lo, float inv) {
    if (gate_row) {
      __nv_bfloat162 gv[HD / 8];
#pragma unroll
      for (int c = 0; c < HD / 8; ++c)
        gv[c] = __ldg(reinterpret_cast<const __nv_bfloat162*>(gate_row + 8 * c + 2 * t4));
#pragma unroll
      for (int c = 0; c < HD / 8; ++c)
        attn_store_gated(dst + 8 * c + 2 * t4, gv[c], o[4 * c + lo] * inv, o[4 * c + lo + 1] * inv);
    } else {
#pragma unroll
      for (int c = 0; c < HD / 8; ++c)
        attn_store_pair(dst + 8 * c + 2 * t4, nullptr, o[4 * c + lo] * inv, o[4 * c + lo + 1] * inv);
    }
  };
  bf16* out_a = out + (int64_t)(start + row_a) * ld_out + (int64_t)head * HD;
  const bf16* gate_a = gate ? gate + (int64_t)(start + row_a) * ld_gate + (int64_t)head * HD : nullptr;
  if (row_a < len) store_row(out_a, gate_a, 0, l[0]);
  if (row_b < len) store_row(out_a + 8 * ld_out, gate ? gate_a + 8 * ld_gate : nullptr, 2, l[1]);
#endif
}

// ---- launchers ----
// cuTensorMapEncodeTiled from the driver, found through the runtime (no link against libcuda).
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  return fn;
}

// rows × cols bf16 (row stride ld elements) read as 64 × 64 boxes with the 128-byte swizzle.
static CUtensorMap tensor_map_bf16(const bf16* p, int64_t rows, int64_t cols, int64_t ld) {
  CUtensorMap tm;
  cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * sizeof(bf16)};
  cuuint32_t box[2] = {64, 64}, elem[2] = {1, 1};
  CUresult r =
      tensor_map_encoder()(&tm, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(p), dims, strides, box,
                           elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    cuda_throw("cuTensorMapEncodeTiled", "could not describe an attention operand", __FILE__, __LINE__);
  return tm;
}

template <int HD>
static void attention_causal_sm90_run(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                      int64_t ld_v, bf16* out, int64_t ld_out, const bf16* gate,
                                      int64_t ld_gate, const int32_t* cu, int num_seqs, int64_t tokens,
                                      int max_len, int hq, int hkv, float scale, cudaStream_t stream) {
  using Cfg = WgAttnCfg<HD>;
  DF_CUDA_CHECK(cudaFuncSetAttribute(attention_causal_sm90_kernel<HD>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmem));
  const CUtensorMap tq = tensor_map_bf16(q, tokens, (int64_t)hq * HD, ld_q);
  const CUtensorMap tk = tensor_map_bf16(k, tokens, (int64_t)hkv * HD, ld_k);
  const CUtensorMap tv = tensor_map_bf16(v, tokens, (int64_t)hkv * HD, ld_v);
  dim3 grid((max_len + Cfg::kRows - 1) / Cfg::kRows, num_seqs, hq);
  attention_causal_sm90_kernel<HD><<<grid, Cfg::kThreads, Cfg::kSmem, stream>>>(
      tq, tk, tv, out, ld_out, gate, ld_gate, cu, hq, hkv, scale * 1.4426950408889634f);
  DF_CUDA_CHECK_LAUNCH("attention_causal_sm90_kernel");
}

bool wgmma_available() {
#ifdef DF_CUDA_SM90A
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

// wgmma_available, unless DFLASH_ATTN=mma turns the path off (read once), for A/B measurements.
static bool attention_sm90_available() {
  static const bool disabled = [] {
    const char* e = std::getenv("DFLASH_ATTN");
    return e && std::strcmp(e, "mma") == 0;
  }();
  return !disabled && wgmma_available();
}

bool attention_causal_sm90_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                  int64_t ld_v, bf16* out, int64_t ld_out, const bf16* gate, int64_t ld_gate,
                                  const int32_t* cu, int num_seqs, int64_t tokens, int max_len, int hq,
                                  int hkv, int hd, float scale, cudaStream_t stream) {
  auto al16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // scale > 0: the kernel takes the running max over unscaled scores (the portable kernel takes any scale).
  const bool shape_ok = (hd == 128 || hd == 256) && ld_q % 8 == 0 && ld_k % 8 == 0 && ld_v % 8 == 0 &&
                        ld_out % 2 == 0 && al16(q) && al16(k) && al16(v) &&
                        reinterpret_cast<uintptr_t>(out) % 4 == 0 && scale > 0.0f;
  if (!shape_ok || !attention_sm90_available() || !tensor_map_encoder()) return false;
  if (hd == 256)
    attention_causal_sm90_run<256>(q, ld_q, k, ld_k, v, ld_v, out, ld_out, gate, ld_gate, cu, num_seqs,
                                   tokens, max_len, hq, hkv, scale, stream);
  else
    attention_causal_sm90_run<128>(q, ld_q, k, ld_k, v, ld_v, out, ld_out, gate, ld_gate, cu, num_seqs,
                                   tokens, max_len, hq, hkv, scale, stream);
  return true;
}

}  // namespace df
