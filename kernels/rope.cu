// Per-head QK RMSNorm followed by rotate-half RoPE on the first rot_dim dims, in place. One block per token:
// the token's cos/sin table (rot_dim/2 angles, shared by all its heads) is built once in shared memory, then
// each warp normalises and rotates heads; a head goes through shared memory because RoPE pairs dim i with
// i + rot/2. Rounding mirrors HF: the norm output is bf16, cos/sin are bf16, and q·cos, rot(q)·sin and their
// sum each round to bf16. The angle pos·inv_freq is formed in fp32 like HF, then sin/cos in double:
// fast-math sinf is wrong by far more than a bf16 ulp at angles of thousands of radians.
#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

constexpr int kRopeWarps = 4;
constexpr int kRopeMaxHd = 512;

// ---- kernels ----
__global__ void __launch_bounds__(32 * kRopeWarps) qk_norm_rope_kernel(bf16* x, int64_t ld_x, const float* w,
                                                                       const int32_t* pos, int heads, int hd,
                                                                       int rot_dim, float theta, float eps,
                                                                       bool zero_centred) {
  __shared__ float buf[kRopeWarps][kRopeMaxHd];
  __shared__ float cos_t[kRopeMaxHd / 2], sin_t[kRopeMaxHd / 2];
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, half = rot_dim / 2;
  const float p = static_cast<float>(pos[t]);
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    float inv_freq = static_cast<float>(pow(static_cast<double>(theta), -2.0 * j / rot_dim));
    double s, c;
    sincos(static_cast<double>(p * inv_freq), &s, &c);
    cos_t[j] = bf16_rn(static_cast<float>(c));
    sin_t[j] = bf16_rn(static_cast<float>(s));
  }
  __syncthreads();
  float* nb = buf[warp];
  for (int h = warp; h < heads; h += kRopeWarps) {
    bf16* row = x + t * ld_x + (int64_t)h * hd;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) {
      float v = __bfloat162float(row[i]);
      nb[i] = v;
      ss += v * v;
    }
    float r = rsqrtf(warp_sum(ss) / static_cast<float>(hd) + eps);
    for (int i = lane; i < hd; i += 32) {
      float v = nb[i] * r;
      nb[i] = bf16_rn(zero_centred ? v * (1.0f + w[i]) : w[i] * bf16_rn(v));
    }
    __syncwarp();
    for (int i = lane; i < hd; i += 32) {
      float y = nb[i];
      if (i < rot_dim) {
        int j = i < half ? i : i - half;
        float rot = i < half ? -nb[i + half] : nb[i - half];
        y = bf16_rn(y * cos_t[j]) + bf16_rn(rot * sin_t[j]);
      }
      row[i] = __float2bfloat16(y);
    }
    __syncwarp();  // nb is reused by this warp's next head
  }
}

// ---- launchers ----
void qk_norm_rope_launch(bf16* x, int64_t ld_x, const float* w, const int32_t* pos, int64_t T, int heads, int hd,
                         int rot_dim, float theta, float eps, bool zero_centred, cudaStream_t stream) {
  if (T == 0 || heads == 0) return;
  if (hd > kRopeMaxHd || rot_dim > hd || rot_dim % 2 != 0)
    cuda_throw("qk_norm_rope_launch", "head_dim must be <= 512 and rot_dim even and <= head_dim", __FILE__, __LINE__);
  qk_norm_rope_kernel<<<static_cast<unsigned>(T), 32 * kRopeWarps, 0, stream>>>(x, ld_x, w, pos, heads, hd, rot_dim,
                                                                                 theta, eps, zero_centred);
  DF_CUDA_CHECK_LAUNCH("qk_norm_rope_kernel");
}

}  // namespace df
