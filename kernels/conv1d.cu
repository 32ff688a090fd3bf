// Depthwise causal conv over time + SiLU for the Gated DeltaNet q/k/v channels. It moves ~2 bytes per flop,
// so its speed is the number of bytes kept in flight per SM: the vector kernel streams a warp down a 32-token
// tile of 256 channels with the next 8 rows' 16-byte loads always outstanding; a scalar kernel covers the
// rest. A tap reaching before the token's sequence start (pos < K−1−j) contributes zero: the reset at every
// sequence boundary. Built for K = 2..8 (every Qwen3.5/3.6 model has 4).
#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

// Vector kernel: a lane owns 8 channels (one 16-byte access per token), a warp 256 channels × kConvTile
// tokens; the warps of a block are stacked along tokens, so a warp's K−1 halo rows are its neighbour's last
// rows and come from L2.
constexpr int kConvTile = 32;   // tokens per warp: lane i loads pos[t0 + i] once, shuffled to the warp
constexpr int kConvAhead = 8;   // rows loaded ahead of their use: 8 × 16 B per lane in flight
constexpr int kConvWarps = 4;   // warps per block
constexpr int kConvSpan = 256;  // channels per warp
// Scalar kernel (any stride or alignment): a thread owns one channel for kConvScalarTokens tokens.
constexpr int kConvScalarTokens = 32;
constexpr int kConvScalarThreads = 128;

namespace {

// One row's 16 bytes (zeros past T or for a lane without channels).
__device__ __forceinline__ uint4 conv_load_row(const bf16* xc, int64_t ld_x, int64_t t, int64_t T,
                                               bool live) {
  return live && t < T ? *reinterpret_cast<const uint4*>(xc + t * ld_x) : make_uint4(0, 0, 0, 0);
}

}  // namespace

// ---- kernels ----
template <int K>
__global__ void __launch_bounds__(32 * kConvWarps)
    conv1d_silu_vec_kernel(const bf16* __restrict__ x, int64_t ld_x, const float* __restrict__ w,
                           bf16* __restrict__ out, int64_t ld_out, const int32_t* __restrict__ pos, int64_t T,
                           int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t t0 = ((int64_t)blockIdx.y * kConvWarps + threadIdx.x / 32) * kConvTile;
  if (t0 >= T) return;  // the whole warp leaves together, so the shuffles below always see 32 lanes
  const int64_t c = (int64_t)blockIdx.x * kConvSpan + lane * 8;
  const bool live = c < C;  // C % 8 == 0 on this path: a live lane has all 8 channels
  const bf16* xc = x + (live ? c : 0);

  uint4 ring[kConvAhead];  // rows t .. t + kConvAhead − 1 while token t is computed, as raw bf16
#pragma unroll
  for (int i = 0; i < kConvAhead; ++i) ring[i] = conv_load_row(xc, ld_x, t0 + i, T, live);
  float win[K][8];  // win[j] = the row of tap j: token t − (K−1) + j; win[K−1] is the token itself
#pragma unroll
  for (int j = 0; j < K - 1; ++j) {  // halo: the K−1 tokens before the tile (masked below by pos)
    const int64_t t = t0 - (K - 1) + j;
    bf16x8_unpack(t >= 0 ? conv_load_row(xc, ld_x, t, T, live) : make_uint4(0, 0, 0, 0), win[j + 1]);
  }
  const int my_pos = t0 + lane < T ? pos[t0 + lane] : 0;
  float wr[8][K];
#pragma unroll
  for (int e = 0; e < 8; ++e)
#pragma unroll
    for (int j = 0; j < K; ++j) wr[e][j] = live ? w[(c + e) * K + j] : 0.0f;

  // Fully unrolled, so ring slots are registers: as soon as a row is unpacked, its slot starts the load of
  // the row kConvAhead tokens later, which keeps kConvAhead loads per lane outstanding through the tile.
#pragma unroll
  for (int i = 0; i < kConvTile; ++i) {
    const int64_t t = t0 + i;
#pragma unroll
    for (int j = 0; j < K - 1; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) win[j][e] = win[j + 1][e];
    bf16x8_unpack(ring[i % kConvAhead], win[K - 1]);
    if (i + kConvAhead < kConvTile) ring[i % kConvAhead] = conv_load_row(xc, ld_x, t + kConvAhead, T, live);
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
    if (live && t < T) store_bf16<8>(out + t * ld_out + c, acc);
  }
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
    const int64_t tokens_per_block = int64_t(kConvTile) * kConvWarps;
    dim3 grid(static_cast<unsigned>((C + kConvSpan - 1) / kConvSpan),
              static_cast<unsigned>((T + tokens_per_block - 1) / tokens_per_block));
    conv1d_silu_vec_kernel<K><<<grid, 32 * kConvWarps, 0, stream>>>(x, ld_x, w, out, ld_out, pos, T, C);
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
