// Row RMSNorm, plain (Qwen3) and zero-centred (Qwen3.5/3.6), with the residual add of the pre-norm block
// fused in. One block per row, 16-byte accesses when the row layout allows; the sum of squares is fp32; the
// row is read twice (the second read hits L1/L2).
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
// V elements per access (8 or 1).
template <int V>
__global__ void rmsnorm_kernel(bf16* x, int64_t ld_x, const bf16* delta, int64_t ld_delta, const float* w, bf16* out,
                               int64_t ld_out, int64_t cols, float eps, bool zero_centred) {
  const int64_t row = blockIdx.x, n = cols / V;
  bf16* xr = x + row * ld_x;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v[V];
    load_bf16<V>(xr + i * V, v);
    if (delta) {
      float d[V];
      load_bf16<V>(delta + row * ld_delta + i * V, d);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = bf16_rn(v[j] + d[j]);
      store_bf16<V>(xr + i * V, v);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) ss += v[j] * v[j];
  }
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(cols) + eps);
  bf16* orow = out + row * ld_out;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v[V];
    load_bf16<V>(xr + i * V, v);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = rmsnorm_apply(v[j], r, w[i * V + j], zero_centred);
    store_bf16<V>(orow + i * V, v);
  }
}

// ---- launchers ----
static void rmsnorm_run(bf16* x, int64_t ld_x, const bf16* delta, int64_t ld_delta, const float* w, bf16* out,
                        int64_t ld_out, int64_t rows, int64_t cols, float eps, bool zero_centred, cudaStream_t stream) {
  if (rows == 0) return;
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  bool vec = cols % 8 == 0 && ld_x % 8 == 0 && ld_out % 8 == 0 && al(x) && al(out) &&
             (!delta || (ld_delta % 8 == 0 && al(delta)));
  int64_t per_thread_items = vec ? cols / 8 : cols;
  unsigned threads = per_thread_items >= 512 ? 256 : (per_thread_items >= 128 ? 128 : 32);
  if (vec)
    rmsnorm_kernel<8><<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, ld_x, delta, ld_delta, w, out, ld_out,
                                                                           cols, eps, zero_centred);
  else
    rmsnorm_kernel<1><<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, ld_x, delta, ld_delta, w, out, ld_out,
                                                                           cols, eps, zero_centred);
  DF_CUDA_CHECK_LAUNCH("rmsnorm_kernel");
}

void rmsnorm_launch(const bf16* x, int64_t ld_x, const float* w, bf16* out, int64_t ld_out, int64_t rows,
                    int64_t cols, float eps, bool zero_centred, cudaStream_t stream) {
  // x is only written when a delta is given; the kernel takes one pointer type for both uses.
  rmsnorm_run(const_cast<bf16*>(x), ld_x, nullptr, 0, w, out, ld_out, rows, cols, eps, zero_centred, stream);
}

void add_rmsnorm_launch(bf16* residual, int64_t ld_res, const bf16* delta, int64_t ld_delta, const float* w,
                        bf16* out, int64_t ld_out, int64_t rows, int64_t cols, float eps, bool zero_centred,
                        cudaStream_t stream) {
  rmsnorm_run(residual, ld_res, delta, ld_delta, w, out, ld_out, rows, cols, eps, zero_centred, stream);
}

}  // namespace df
