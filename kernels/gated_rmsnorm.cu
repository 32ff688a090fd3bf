// The Gated DeltaNet output norm: RMSNorm per (token, value head) over dv, not zero-centred, times silu(z).
// One warp per (token, head); mirrors Qwen3_5RMSNormGated: w·bf16(x̂) rounded to bf16, then · silu(z) in fp32.
#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

// ---- kernels ----
__global__ void gated_rmsnorm_kernel(const bf16* o, int64_t ld_o, const bf16* z, int64_t ld_z, const float* w,
                                     bf16* out, int64_t ld_out, int64_t T, int heads, int dv, float eps) {
  int64_t item = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  if (item >= T * heads) return;
  int lane = threadIdx.x & 31;
  int64_t t = item / heads;
  int h = static_cast<int>(item % heads);
  const bf16* orow = o + t * ld_o + (int64_t)h * dv;
  const bf16* zrow = z + t * ld_z + (int64_t)h * dv;
  bf16* yrow = out + t * ld_out + (int64_t)h * dv;
  float ss = 0.0f;
  for (int i = lane; i < dv; i += 32) {
    float v = __bfloat162float(orow[i]);
    ss += v * v;
  }
  float r = rsqrtf(warp_sum(ss) / static_cast<float>(dv) + eps);
  for (int i = lane; i < dv; i += 32) {
    float n = bf16_rn(w[i] * bf16_rn(__bfloat162float(orow[i]) * r));
    yrow[i] = __float2bfloat16(n * silu_f32(__bfloat162float(zrow[i])));
  }
}

// ---- launchers ----
void gated_rmsnorm_launch(const bf16* o, int64_t ld_o, const bf16* z, int64_t ld_z, const float* w, bf16* out,
                          int64_t ld_out, int64_t T, int heads, int dv, float eps, cudaStream_t stream) {
  int64_t items = T * heads;
  if (items == 0) return;
  gated_rmsnorm_kernel<<<static_cast<unsigned>((items + 7) / 8), 256, 0, stream>>>(o, ld_o, z, ld_z, w, out, ld_out,
                                                                                 T, heads, dv, eps);
  DF_CUDA_CHECK_LAUNCH("gated_rmsnorm_kernel");
}

}  // namespace df
