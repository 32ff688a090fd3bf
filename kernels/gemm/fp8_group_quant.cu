// Per-token, per-128-column e4m3 quantisation of a linear layer's input, for the block-scaled FP8 GEMM of a
// 128x128 block checkpoint (gemm.cuh gemm_fp8_block_launch): the codes and the VEC128 scales cuBLASLt reads
// (laid out as core/fp8.h fp8_group_scale_index says),
// bit-identical to CpuOps::fp8_round_rows(x, 128): the row quantiser's IEEE scale and reciprocal and the
// hardware conversion (kernels/gemm/fp8_rows.cuh).
#include "core/fp8.h"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/gemm/fp8_rows.cuh"
#include "kernels/launchers.cuh"

namespace df {

namespace {

constexpr int kGroup = 128;         // columns per scale: cuBLASLt's VEC128_32F
constexpr int kGroupsPerBlock = 4;  // one warp per (row, group)
constexpr int kPerLane = kGroup / 32;

// Warp w of block (r, y) takes group g = y·4 + w of row r: lane l holds columns g·128 + l + 32·j. fmaxf skips
// NaN as the CPU's std::max(amax, NaN) does.
__global__ void fp8_quantize_groups_kernel(bf16* x, int64_t ldx, uint8_t* q, int64_t ldq, float* scale,
                                           int64_t rows, int64_t cols, int64_t groups, bool write_back) {
  const int64_t r = blockIdx.x, g = int64_t(blockIdx.y) * kGroupsPerBlock + (threadIdx.x >> 5);
  if (g >= groups) return;
  const int lane = threadIdx.x & 31;
  const int64_t c0 = g * kGroup;
  float v[kPerLane];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = c0 + lane + 32 * j;
    v[j] = c < cols ? __bfloat162float(x[r * ldx + c]) : 0.0f;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  amax = warp_max(amax);
  const float s = row_scale(amax), inv = ieee_rcp(s);  // core/fp8.h e4m3_scale, e4m3_inv_scale
  if (lane == 0) scale[fp8_group_scale_index(r, g, rows, groups)] = s;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = c0 + lane + 32 * j;
    if (c >= cols) continue;
    const uint8_t code = __nv_cvt_float_to_fp8(ieee_mul(v[j], inv), __NV_SATFINITE, __NV_E4M3);
    q[r * ldq + c] = code;
    if (write_back) x[r * ldx + c] = __float2bfloat16_rn(e4m3x2_dequant(code, s).x);
  }
}

}  // namespace

void fp8_quantize_groups_launch(bf16* x, int64_t ldx, uint8_t* q, int64_t ldq, float* scale, int64_t rows,
                                int64_t cols, bool write_back, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t groups = (cols + kGroup - 1) / kGroup;
  DF_CHECK(rows <= 0x7fffffff && (groups + kGroupsPerBlock - 1) / kGroupsPerBlock <= 65535,
           "fp8_quantize_groups: %lld rows x %lld columns exceed the grid", (long long)rows, (long long)cols);
  const dim3 grid(unsigned(rows), unsigned((groups + kGroupsPerBlock - 1) / kGroupsPerBlock));
  fp8_quantize_groups_kernel<<<grid, 32 * kGroupsPerBlock, 0, stream>>>(x, ldx, q, ldq, scale, rows, cols,
                                                                        groups, write_back);
  DF_CUDA_CHECK_LAUNCH("fp8_quantize_groups_kernel");
}

}  // namespace df
