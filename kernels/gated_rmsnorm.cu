// The Gated DeltaNet output norm: RMSNorm per (token, value head) over dv, not zero-centred, times silu(z).
// One warp per (token, head), 8-byte accesses when dv and the strides allow; mirrors Qwen3_5RMSNormGated:
// w·bf16(x̂) rounded to bf16, then · silu(z) in fp32.
#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

// ---- kernels ----
template <int V>
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
  for (int i = lane * V; i < dv; i += 32 * V) {
    float v[V];
    load_bf16<V>(orow + i, v);
#pragma unroll
    for (int j = 0; j < V; ++j) ss += v[j] * v[j];
  }
  float r = rsqrtf(warp_sum(ss) / static_cast<float>(dv) + eps);
  for (int i = lane * V; i < dv; i += 32 * V) {
    float v[V], zv[V];
    load_bf16<V>(orow + i, v);
    load_bf16<V>(zrow + i, zv);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = bf16_rn(w[i + j] * bf16_rn(v[j] * r)) * silu_f32(zv[j]);
    store_bf16<V>(yrow + i, v);
  }
}

// ---- launchers ----
void gated_rmsnorm_launch(const bf16* o, int64_t ld_o, const bf16* z, int64_t ld_z, const float* w, bf16* out,
                          int64_t ld_out, int64_t T, int heads, int dv, float eps, cudaStream_t stream) {
  int64_t items = T * heads;
  if (items == 0) return;
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; };
  bool vec = dv % 4 == 0 && ld_o % 4 == 0 && ld_z % 4 == 0 && ld_out % 4 == 0 && al(o) && al(z) && al(out);
  unsigned blocks = static_cast<unsigned>((items + 7) / 8);
  if (vec)
    gated_rmsnorm_kernel<4><<<blocks, 256, 0, stream>>>(o, ld_o, z, ld_z, w, out, ld_out, T, heads, dv, eps);
  else
    gated_rmsnorm_kernel<1><<<blocks, 256, 0, stream>>>(o, ld_o, z, ld_z, w, out, ld_out, T, heads, dv, eps);
  DF_CUDA_CHECK_LAUNCH("gated_rmsnorm_kernel");
}

}  // namespace df
