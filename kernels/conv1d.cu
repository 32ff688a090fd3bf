// Depthwise causal conv over time + SiLU for the Gated DeltaNet q/k/v channels. A thread owns V channels (8,
// one 16-byte load per token, when the strides allow it) for a tile of 32 consecutive tokens: the K weights
// and a sliding window of the last K inputs stay in registers, so each input is read once (plus K−1 halo
// rows per tile); loads coalesce across channels.
// A tap reaching before the token's sequence start (pos < K−1−j) contributes zero: the reset at every
// sequence boundary. Only K = 4 (every Qwen3.5/3.6 model) is instantiated.
#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

constexpr int kConvTokens = 32;   // tokens per thread
constexpr int kConvThreads = 128; // channels per block

// ---- kernels ----
template <int K, int V>
__global__ void __launch_bounds__(kConvThreads) conv1d_silu_kernel(const bf16* __restrict__ x, int64_t ld_x,
                                                                   const float* w, bf16* __restrict__ out,
                                                                   int64_t ld_out, const int32_t* pos, int64_t T,
                                                                   int64_t C) {
  const int64_t c = (blockIdx.x * (int64_t)kConvThreads + threadIdx.x) * V;
  if (c >= C) return;
  const int64_t t0 = blockIdx.y * (int64_t)kConvTokens;
  const int64_t t1 = min(t0 + kConvTokens, T);
  float wr[V][K], win[K][V];
#pragma unroll
  for (int e = 0; e < V; ++e)
#pragma unroll
    for (int j = 0; j < K; ++j) wr[e][j] = w[(c + e) * K + j];
#pragma unroll
  for (int j = 0; j < K - 1; ++j) {  // halo: the K−1 tokens before the tile (masked below by pos)
    int64_t t = t0 - (K - 1) + j;
    if (t >= 0) {
      load_bf16<V>(x + t * ld_x + c, win[j + 1]);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) win[j + 1][e] = 0.0f;
    }
  }
#pragma unroll 4  // x and out never alias, so the unrolled loads of later tokens issue together
  for (int64_t t = t0; t < t1; ++t) {
#pragma unroll
    for (int j = 0; j < K - 1; ++j)
#pragma unroll
      for (int e = 0; e < V; ++e) win[j][e] = win[j + 1][e];
    load_bf16<V>(x + t * ld_x + c, win[K - 1]);
    const int p = pos[t];
    float acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      acc[e] = 0.0f;
#pragma unroll
      for (int j = 0; j < K; ++j)
        if (K - 1 - j <= p) acc[e] += wr[e][j] * win[j][e];
      acc[e] = silu_f32(acc[e]);
    }
    store_bf16<V>(out + t * ld_out + c, acc);
  }
}

// ---- launchers ----
void conv1d_silu_launch(const bf16* x, int64_t ld_x, const float* w, int K, bf16* out, int64_t ld_out,
                        const int32_t* pos, int64_t T, int64_t C, cudaStream_t stream) {
  if (T == 0 || C == 0) return;
  if (K != 4)
    cuda_throw("conv1d_silu_launch", "only conv kernel size 4 is built (Qwen3.5/3.6); add an instantiation",
               __FILE__, __LINE__);
  const bool vec = C % 8 == 0 && ld_x % 8 == 0 && ld_out % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int64_t per_block = kConvThreads * (vec ? 8 : 1);
  dim3 grid(static_cast<unsigned>((C + per_block - 1) / per_block),
            static_cast<unsigned>((T + kConvTokens - 1) / kConvTokens));
  if (vec)
    conv1d_silu_kernel<4, 8><<<grid, kConvThreads, 0, stream>>>(x, ld_x, w, out, ld_out, pos, T, C);
  else
    conv1d_silu_kernel<4, 1><<<grid, kConvThreads, 0, stream>>>(x, ld_x, w, out, ld_out, pos, T, C);
  DF_CUDA_CHECK_LAUNCH("conv1d_silu_kernel");
}

}  // namespace df
