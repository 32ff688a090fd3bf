// The FP8 experts' grouped GEMM (moe.cuh moe_fp8_gemm_launch). cuBLASLt's pointer-array batch takes one scale
// pointer per matrix for the whole batch, so a batch whose tiles belong to different experts cannot carry
// each expert's block scales, and per-expert block-scaled calls need each expert's row count on the host (a
// stream sync per layer). So this is an own kernel over the same tile plan as the bf16 path: every block
// reads its tile's expert on the device, multiplies e4m3 codes with mma.sync m16n8k32 (sm_89 and later) in
// fp32, and applies the scales to each 128-column K group's partial sum (block scales) or once at the end
// (per-token and per-channel scales), as the block-scaled GEMMs of DeepSeek-style FP8 inference do.
#include <cuda_bf16.h>

#include "core/fp8.h"
#include "kernels/dispatch/dispatch.h"
#include "kernels/moe/moe.cuh"
#include "kernels/primitives/cuda_check.cuh"

namespace df {

namespace {

constexpr int kTileM = 64;               // rows a block computes (four warps of 16)
constexpr int kTileN = 64;               // columns a block computes (eight mma n-tiles of 8 per warp)
constexpr int kChunkK = 128;             // K staged in shared memory at once: one scale group
constexpr int kRowBytes = kChunkK + 16;  // padded shared-memory row: fragment loads hit 32 distinct banks
constexpr int kThreads = 128;

// d += a · b for one m16n8k32 e4m3 tile (fp32 accumulation). a: four registers of four codes (rows g and g +
// 8, K columns tig·4.. and 16 + tig·4..); b: two registers (column g, the same K columns).
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // the launcher refuses devices before sm_89
#endif
}

// Block (x, y): columns [y·64, y·64 + 64) of the rows [tile·rows + sub·64, +64) of tile x / subs (subs = the
// 64-row parts of a tile). Tiles at or past *used rows are bound padding (moe_plan_tiles) and skip.
__global__ void __launch_bounds__(kThreads)
    moe_fp8_gemm_kernel(const uint8_t* a, const float* sa, int64_t m_total, const uint8_t* w, const float* sw,
                        int64_t ld_sw, bool blocks, const int32_t* tile_expert, const int32_t* used, int rows,
                        int subs, __nv_bfloat16* c, int64_t ldc, int64_t N, int64_t K) {
  __shared__ __align__(16) uint8_t as[kTileM * kRowBytes];
  __shared__ __align__(16) uint8_t ws[kTileN * kRowBytes];
  const int64_t tile = blockIdx.x / subs;
  const int64_t r0 = tile * rows + int64_t(blockIdx.x % subs) * kTileM;
  const int64_t m_end = min(m_total, min(tile * rows + rows, used ? int64_t(*used) : m_total));
  if (r0 >= m_end) return;
  const int m_valid = int(m_end - r0 < kTileM ? m_end - r0 : int64_t(kTileM));
  const int64_t n0 = int64_t(blockIdx.y) * kTileN;
  const int64_t e = tile_expert ? tile_expert[tile] : 0;
  const uint8_t* we = w + e * N * K;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const int64_t groups = (K + kChunkK - 1) / kChunkK;
  float acc[8][4] = {}, part[8][4] = {};
  for (int64_t kc = 0; kc < groups; ++kc) {
    const int64_t k0 = kc * kChunkK;
    // 64 rows x 128 codes of each operand, 16 bytes a thread and step; outside the matrix: zeros.
    for (int i = threadIdx.x; i < kTileM * (kChunkK / 16); i += kThreads) {
      const int r = i / (kChunkK / 16), col = (i % (kChunkK / 16)) * 16;
      uint4 va = make_uint4(0, 0, 0, 0), vw = make_uint4(0, 0, 0, 0);
      if (r < m_valid && k0 + col < K) va = *reinterpret_cast<const uint4*>(a + (r0 + r) * K + k0 + col);
      if (n0 + r < N && k0 + col < K) vw = *reinterpret_cast<const uint4*>(we + (n0 + r) * K + k0 + col);
      *reinterpret_cast<uint4*>(as + r * kRowBytes + col) = va;
      *reinterpret_cast<uint4*>(ws + r * kRowBytes + col) = vw;
    }
    __syncthreads();
    if (warp * 16 < m_valid) {
#pragma unroll
      for (int ks = 0; ks < kChunkK; ks += 32) {
        const uint8_t* ar = as + (warp * 16 + g) * kRowBytes + ks + tig * 4;
        const uint32_t fa[4] = {*reinterpret_cast<const uint32_t*>(ar),
                                *reinterpret_cast<const uint32_t*>(ar + 8 * kRowBytes),
                                *reinterpret_cast<const uint32_t*>(ar + 16),
                                *reinterpret_cast<const uint32_t*>(ar + 8 * kRowBytes + 16)};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint8_t* br = ws + (j * 8 + g) * kRowBytes + ks + tig * 4;
          mma_e4m3(part[j], fa, *reinterpret_cast<const uint32_t*>(br),
                   *reinterpret_cast<const uint32_t*>(br + 16));
        }
      }
      if (blocks) {  // this K group's scales: the row's group scale times the weight block's
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int64_t r = r0 + warp * 16 + g + (q >= 2 ? 8 : 0), n = n0 + j * 8 + tig * 2 + (q & 1);
            if (r < m_end && n < N) {
              const float s =
                  sa[fp8_group_scale_index(r, kc, m_total, groups)] * sw[((e * N + n) / 128) * ld_sw + kc];
              acc[j][q] += part[j][q] * s;
            }
            part[j][q] = 0.0f;
          }
      }
    }
    __syncthreads();
  }
  if (warp * 16 >= m_valid) return;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int64_t r = r0 + warp * 16 + g + (q >= 2 ? 8 : 0), n = n0 + j * 8 + tig * 2 + (q & 1);
      if (r >= r0 + m_valid || n >= N) continue;
      const float v = blocks ? acc[j][q] : part[j][q] * sa[r] * sw[e * N + n];
      c[r * ldc + n] = __float2bfloat16_rn(v);
    }
}

}  // namespace

void moe_fp8_gemm_launch(const uint8_t* a, const float* sa, int64_t m_total, const uint8_t* w,
                         const float* sw, int group, const int32_t* tile_expert, const int32_t* used,
                         int rows, int64_t tiles, __nv_bfloat16* c, int64_t ldc, int64_t N, int64_t K,
                         cudaStream_t stream) {
  if (tiles == 0 || N == 0) return;
  DF_CHECK(
      K % 16 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0,
      "moe_fp8_gemm: K %lld must be a multiple of 16 and the codes 16-byte aligned", (long long)K);
  DF_CHECK(group == 0 || (group == 128 && N % 128 == 0),
           "moe_fp8_gemm: group %d with N %lld: block scales need whole 128-row blocks per expert", group,
           (long long)N);
  DF_CHECK(rows > 0 && (rows <= kTileM || rows % kTileM == 0), "moe_fp8_gemm: %d rows a tile", rows);
  const DeviceCaps& caps = device_caps();
  DF_CHECK(caps.cc_major * 10 + caps.cc_minor >= 89,
           "moe_fp8_gemm: FP8 experts need e4m3 tensor cores (compute capability 8.9 or later), this GPU is "
           "%d.%d%s; HINT: target.dtype = \"bf16\"",
           caps.cc_major, caps.cc_minor, caps.profile.empty() ? "" : (" (profile " + caps.profile + ")").c_str());
  const int subs = rows > kTileM ? rows / kTileM : 1;
  const int64_t col_blocks = (N + kTileN - 1) / kTileN;
  DF_CHECK(col_blocks <= 65535 && tiles * subs < INT32_MAX,
           "moe_fp8_gemm: %lld x %lld blocks exceed the grid", (long long)(tiles * subs),
           (long long)col_blocks);
  const dim3 grid(unsigned(tiles * subs), unsigned(col_blocks));
  moe_fp8_gemm_kernel<<<grid, kThreads, 0, stream>>>(a, sa, m_total, w, sw, fp8_block_scale_ld(K),
                                                     group == 128, tile_expert, used, rows, subs, c, ldc, N,
                                                     K);
  DF_CUDA_CHECK_LAUNCH("moe_fp8_gemm_kernel");
}

}  // namespace df
