// Depthwise causal conv over time + SiLU for the Gated DeltaNet q/k/v channels. One thread per (token,
// channel), channels fastest so loads coalesce; the K−1 earlier rows come from L1/L2. A tap reaching before
// the token's sequence start (pos < K−1−j) reads zero, which is the reset at every sequence boundary.
#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

// ---- kernels ----
__global__ void conv1d_silu_kernel(const bf16* x, int64_t ld_x, const float* w, int K, bf16* out, int64_t ld_out,
                                   const int32_t* pos, int64_t T, int64_t C) {
  int64_t n = T * C;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t t = i / C, c = i % C;
    int p = pos[t];
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) {
      int back = K - 1 - j;
      if (back <= p) acc += w[c * K + j] * __bfloat162float(x[(t - back) * ld_x + c]);
    }
    out[t * ld_out + c] = __float2bfloat16(silu_f32(acc));
  }
}

// ---- launchers ----
void conv1d_silu_launch(const bf16* x, int64_t ld_x, const float* w, int K, bf16* out, int64_t ld_out,
                        const int32_t* pos, int64_t T, int64_t C, cudaStream_t stream) {
  int64_t n = T * C;
  if (n == 0) return;
  int64_t blocks = (n + 255) / 256;
  if (blocks > 132 * 64) blocks = 132 * 64;
  conv1d_silu_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(x, ld_x, w, K, out, ld_out, pos, T, C);
  DF_CUDA_CHECK_LAUNCH("conv1d_silu_kernel");
}

}  // namespace df
