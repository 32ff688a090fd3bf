// Depthwise causal conv over time + SiLU for the Gated DeltaNet q/k/v channels. It moves ~2 bytes per flop,
// so its speed is the number of bytes kept in flight per SM: the vector kernel streams a 256-channel column
// of 256 tokens through a shared-memory ring of 32-row stages, two stages of cp.async copies always in flight
// while a third is computed, so each input row is read from memory once (plus a K−1 row halo per block) and
// the arithmetic only waits for copies issued two stages earlier. A scalar kernel covers any other stride or
// alignment. A tap reaching before the token's sequence start (pos < K−1−j) contributes zero: the reset at
// every sequence boundary. Built for K = 2..8 (every Qwen3.5/3.6 model has 4).
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/dispatch/dispatch.h"
#include "kernels/primitives/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

// Vector kernel: a row of a block's span is 32 chunks of 8 channels (16 bytes each, lane i owns chunk i); a
// warp computes 8 consecutive rows of a stage, so a thread slides its K-row window down its own 8 channels.
constexpr int kConvSpan = 256;                             // channels per block
constexpr int kConvStageRows = 32;                         // rows per cp.async stage (4 warps × 8 rows)
constexpr int kConvRing = 4;                               // stages in shared memory (64 KB)
constexpr int kConvRingRows = kConvRing * kConvStageRows;  // a power of two: slot = row mod kConvRingRows
constexpr int kConvBlockStages = 8;                        // 256 tokens per block: the halo re-read is ~1 %
constexpr int kConvThreads = 128;
constexpr int kConvWarpRows = kConvStageRows / (kConvThreads / 32);  // 8 rows of a stage per warp
// Scalar kernel (any stride or alignment): a thread owns one channel for kConvScalarTokens tokens.
constexpr int kConvScalarTokens = 32;
constexpr int kConvScalarThreads = 128;

namespace {

// Rows [t_first, t_first + rows) of the block's span into their ring slots (slot = (t − tb) mod ring rows),
// zeros for rows outside [0, T) and channels past C, committed as one cp.async group.
__device__ __forceinline__ void conv_copy_rows(uint4* ring, const bf16* x, int64_t ld_x, int64_t c_blk,
                                               int64_t C, int64_t T, int64_t tb, int64_t t_first, int rows) {
  for (int i = threadIdx.x; i < rows * (kConvSpan / 8); i += kConvThreads) {
    const int64_t t = t_first + i / (kConvSpan / 8), c = c_blk + (i % (kConvSpan / 8)) * 8;
    const bool in = t >= 0 && t < T && c < C;
    const int slot = static_cast<int>((t - tb) & (kConvRingRows - 1));
    const uint32_t to =
        static_cast<uint32_t>(__cvta_generic_to_shared(ring + slot * (kConvSpan / 8) + i % (kConvSpan / 8)));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(in ? x + t * ld_x + c : x),
                 "r"(in ? 16 : 0));
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

}  // namespace

// ---- kernels ----
// Stage s (rows tb + 32s ..) is computed while stages s + 1 and s + 2 are copied. The copy of stage s + 2
// overwrites stage s − 2, which every warp finished with before the barrier of iteration s (stage s − 1,
// still needed as stage s's halo, is kept).
template <int K>
__global__ void __launch_bounds__(kConvThreads)
    conv1d_silu_vec_kernel(const bf16* __restrict__ x, int64_t ld_x, const float* __restrict__ w,
                           bf16* __restrict__ out, int64_t ld_out, const int32_t* __restrict__ pos, int64_t T,
                           int64_t C) {
  static_assert(K - 1 <= kConvStageRows, "the halo must fit in the previous stage");
  extern __shared__ __align__(16) unsigned char conv_smem[];
  uint4* ring = reinterpret_cast<uint4*>(conv_smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t c_blk = (int64_t)blockIdx.x * kConvSpan,
                tb = (int64_t)blockIdx.y * kConvBlockStages * kConvStageRows;
  const int64_t c = c_blk + lane * 8;
  const bool live = c < C;  // C % 8 == 0 on this path: a live lane has all 8 channels

  conv_copy_rows(ring, x, ld_x, c_blk, C, T, tb, tb - (K - 1), K - 1 + kConvStageRows);  // halo + stage 0
  conv_copy_rows(ring, x, ld_x, c_blk, C, T, tb, tb + kConvStageRows, kConvStageRows);
  float wr[8][K];
#pragma unroll
  for (int e = 0; e < 8; ++e)
#pragma unroll
    for (int j = 0; j < K; ++j) wr[e][j] = live ? w[(c + e) * K + j] : 0.0f;

  for (int s = 0; s < kConvBlockStages; ++s) {
    const int64_t t_stage = tb + (int64_t)s * kConvStageRows;
    if (t_stage >= T) break;  // the same for the whole block
    const int64_t t0 = t_stage + warp * kConvWarpRows;
    const int my_pos = lane < kConvWarpRows && t0 + lane < T ? pos[t0 + lane] : 0;  // read during the wait
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // this thread's copies of stage s are done
    __syncthreads();  // everyone's are visible, and every warp is done with stage s − 1's compute
    const int64_t t_next = t_stage + 2 * kConvStageRows;
    conv_copy_rows(
        ring, x, ld_x, c_blk, C, T, tb, t_next,
        s + 2 < kConvBlockStages && t_next < T ? kConvStageRows : 0);  // an empty group keeps the count

    auto row = [&](int64_t t) { return ring[((t - tb) & (kConvRingRows - 1)) * (kConvSpan / 8) + lane]; };
    float win[K][8];  // win[j] = the row of tap j: token t − (K−1) + j; win[K−1] is the token itself
#pragma unroll
    for (int j = 0; j < K - 1; ++j) bf16x8_unpack(row(t0 - (K - 1) + j), win[j + 1]);
#pragma unroll
    for (int i = 0; i < kConvWarpRows; ++i) {
      const int64_t t = t0 + i;
      if (t >= T) break;  // the same for the whole warp
#pragma unroll
      for (int j = 0; j < K - 1; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e) win[j][e] = win[j + 1][e];
      bf16x8_unpack(row(t), win[K - 1]);
      const int p = __shfl_sync(0xffffffffu, my_pos, i);
      float acc[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        acc[e] = 0.0f;
#pragma unroll
        for (int j = 0; j < K; ++j)
          if (K - 1 - j <= p) acc[e] += wr[e][j] * win[j][e];
        acc[e] = silu_f32(acc[e]);
      }
      if (live) store_bf16<8>(out + t * ld_out + c, acc);
    }
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");  // a block that stopped at T leaves no copy in flight
}

template <int K>
__global__ void __launch_bounds__(kConvScalarThreads)
    conv1d_silu_scalar_kernel(const bf16* __restrict__ x, int64_t ld_x, const float* w,
                              bf16* __restrict__ out, int64_t ld_out, const int32_t* pos, int64_t T,
                              int64_t C) {
  const int64_t c = blockIdx.x * (int64_t)kConvScalarThreads + threadIdx.x;
  if (c >= C) return;
  const int64_t t0 = blockIdx.y * (int64_t)kConvScalarTokens;
  const int64_t t1 = min(t0 + kConvScalarTokens, T);
  float wr[K], win[K];
#pragma unroll
  for (int j = 0; j < K; ++j) wr[j] = w[c * K + j];
#pragma unroll
  for (int j = 0; j < K - 1; ++j) {  // halo: the K−1 tokens before the tile (masked below by pos)
    const int64_t t = t0 - (K - 1) + j;
    win[j + 1] = t >= 0 ? __bfloat162float(x[t * ld_x + c]) : 0.0f;
  }
#pragma unroll 4
  for (int64_t t = t0; t < t1; ++t) {
#pragma unroll
    for (int j = 0; j < K - 1; ++j) win[j] = win[j + 1];
    win[K - 1] = __bfloat162float(x[t * ld_x + c]);
    const int p = pos[t];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j)
      if (K - 1 - j <= p) acc += wr[j] * win[j];
    out[t * ld_out + c] = __float2bfloat16(silu_f32(acc));
  }
}

// ---- launchers ----
namespace {

template <int K>
void conv1d_silu_run(const bf16* x, int64_t ld_x, const float* w, bf16* out, int64_t ld_out, const int32_t* pos,
                     int64_t T, int64_t C, cudaStream_t stream) {
  const bool vec = C % 8 == 0 && ld_x % 8 == 0 && ld_out % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec) {
    const int64_t tokens_per_block = int64_t(kConvBlockStages) * kConvStageRows;
    const size_t smem = sizeof(uint4) * kConvRingRows * (kConvSpan / 8);
    kernel_smem_opt_in(reinterpret_cast<const void*>(conv1d_silu_vec_kernel<K>), smem, "conv1d_silu_vec_kernel");
    dim3 grid(static_cast<unsigned>((C + kConvSpan - 1) / kConvSpan),
              static_cast<unsigned>((T + tokens_per_block - 1) / tokens_per_block));
    conv1d_silu_vec_kernel<K><<<grid, kConvThreads, smem, stream>>>(x, ld_x, w, out, ld_out, pos, T, C);
    DF_CUDA_CHECK_LAUNCH("conv1d_silu_vec_kernel");
  } else {
    dim3 grid(static_cast<unsigned>((C + kConvScalarThreads - 1) / kConvScalarThreads),
              static_cast<unsigned>((T + kConvScalarTokens - 1) / kConvScalarTokens));
    conv1d_silu_scalar_kernel<K><<<grid, kConvScalarThreads, 0, stream>>>(x, ld_x, w, out, ld_out, pos, T, C);
    DF_CUDA_CHECK_LAUNCH("conv1d_silu_scalar_kernel");
  }
}

}  // namespace

void conv1d_silu_launch(const bf16* x, int64_t ld_x, const float* w, int K, bf16* out, int64_t ld_out,
                        const int32_t* pos, int64_t T, int64_t C, cudaStream_t stream) {
  if (T == 0 || C == 0) return;
  switch (K) {
    case 2: return conv1d_silu_run<2>(x, ld_x, w, out, ld_out, pos, T, C, stream);
    case 3: return conv1d_silu_run<3>(x, ld_x, w, out, ld_out, pos, T, C, stream);
    case 4: return conv1d_silu_run<4>(x, ld_x, w, out, ld_out, pos, T, C, stream);
    case 5: return conv1d_silu_run<5>(x, ld_x, w, out, ld_out, pos, T, C, stream);
    case 6: return conv1d_silu_run<6>(x, ld_x, w, out, ld_out, pos, T, C, stream);
    case 7: return conv1d_silu_run<7>(x, ld_x, w, out, ld_out, pos, T, C, stream);
    case 8: return conv1d_silu_run<8>(x, ld_x, w, out, ld_out, pos, T, C, stream);
    default:
      cuda_throw("conv1d_silu_launch", "conv kernel sizes 2..8 are built (Qwen3.5/3.6 use 4)", __FILE__, __LINE__);
  }
}

}  // namespace df
