// Row RMSNorm, plain (Qwen3) and zero-centred (Qwen3.5/3.6), with the residual add of the pre-norm block
// fused in. One block per row; the sum of squares is fp32; the row is read twice (the second read hits L1/L2).
#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

// ---- kernels ----
// y from the normalised value x̂ = x·r: zero-centred (1 + w)·x̂ in fp32, plain w·bf16(x̂) like Qwen3RMSNorm.
__device__ __forceinline__ float rmsnorm_apply(float x, float r, float w, bool zero_centred) {
  return zero_centred ? x * r * (1.0f + w) : w * bf16_rn(x * r);
}

// With delta != nullptr, residual += delta first (rounded to bf16, as the stored residual stream is).
__global__ void rmsnorm_kernel(bf16* x, int64_t ld_x, const bf16* delta, int64_t ld_delta, const float* w, bf16* out,
                               int64_t ld_out, int64_t cols, float eps, bool zero_centred) {
  int64_t row = blockIdx.x;
  bf16* xr = x + row * ld_x;
  float ss = 0.0f;
  if (delta) {
    const bf16* dr = delta + row * ld_delta;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      bf16 s = __float2bfloat16(__bfloat162float(xr[c]) + __bfloat162float(dr[c]));
      xr[c] = s;
      float v = __bfloat162float(s);
      ss += v * v;
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float v = __bfloat162float(xr[c]);
      ss += v * v;
    }
  }
  float r = rsqrtf(block_sum(ss) / static_cast<float>(cols) + eps);
  bf16* orow = out + row * ld_out;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    orow[c] = __float2bfloat16(rmsnorm_apply(__bfloat162float(xr[c]), r, w[c], zero_centred));
}

// ---- launchers ----
static unsigned rmsnorm_threads(int64_t cols) { return cols >= 1024 ? 256 : (cols >= 256 ? 128 : 32); }

void rmsnorm_launch(const bf16* x, int64_t ld_x, const float* w, bf16* out, int64_t ld_out, int64_t rows,
                    int64_t cols, float eps, bool zero_centred, cudaStream_t stream) {
  if (rows == 0) return;
  rmsnorm_kernel<<<static_cast<unsigned>(rows), rmsnorm_threads(cols), 0, stream>>>(
      const_cast<bf16*>(x), ld_x, nullptr, 0, w, out, ld_out, cols, eps, zero_centred);
  DF_CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}

void add_rmsnorm_launch(bf16* residual, int64_t ld_res, const bf16* delta, int64_t ld_delta, const float* w,
                        bf16* out, int64_t ld_out, int64_t rows, int64_t cols, float eps, bool zero_centred,
                        cudaStream_t stream) {
  if (rows == 0) return;
  rmsnorm_kernel<<<static_cast<unsigned>(rows), rmsnorm_threads(cols), 0, stream>>>(
      residual, ld_res, delta, ld_delta, w, out, ld_out, cols, eps, zero_centred);
  DF_CUDA_CHECK_LAUNCH("add_rmsnorm_kernel");
}

}  // namespace df
