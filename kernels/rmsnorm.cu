// Row RMSNorm, plain (Qwen3) and zero-centred (Qwen3.5/3.6), with the residual add of the pre-norm block
// fused in. Memory-bound: the register kernel reads each row from global memory once, all of a thread's
// 16-byte loads in flight before the reduction; a two-pass kernel covers every other shape and alignment.
#include <algorithm>

#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

// Register kernel geometry: 8 bf16 (16 bytes) per chunk, up to kRegMaxChunks chunks per thread. The launcher
// aims at kRegThreads threads per row (5120 cols: 128 threads x 5 chunks, 10 KB of loads in flight per block,
// several blocks per SM) and grows the block to kRegMaxThreads for wider rows.
constexpr int kRegMaxChunks = 8;
constexpr int kRegThreads = 128;
constexpr int kRegMaxThreads = 512;

// ---- kernels ----
// One block per row; thread t holds chunks t, t + blockDim, ... (NC of them, coalesced across the block) as
// raw bf16 in registers from the load to the output. With delta != nullptr, residual += delta first, rounded
// to bf16 and written back; the norm then sees the rounded residual, as in rmsnorm_kernel. Numerics are those
// of rmsnorm_kernel except the order of the fp32 sum of squares (per-thread partials over its chunks, then
// the block tree), so results can differ from it in the last bits of r.
template <int NC>
__global__ void __launch_bounds__(kRegMaxThreads)
    rmsnorm_reg_kernel(bf16* x, int64_t ld_x, const bf16* __restrict__ delta, int64_t ld_delta,
                       const float* __restrict__ w, bf16* out, int64_t ld_out, int64_t cols, float eps,
                       bool zero_centred) {
  const int64_t row = blockIdx.x;
  const int n = static_cast<int>(cols / 8);
  bf16* xr = x + row * ld_x;
  uint4 u[NC];
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    u[k] = i < n ? *reinterpret_cast<const uint4*>(xr + i * 8) : make_uint4(0, 0, 0, 0);
  }
  if (delta) {
    const bf16* dr = delta + row * ld_delta;
    uint4 du[NC];
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      du[k] = i < n ? *reinterpret_cast<const uint4*>(dr + i * 8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      float v[8], d[8];
      bf16x8_unpack(u[k], v);
      bf16x8_unpack(du[k], d);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] + d[j];
      u[k] = bf16x8_pack(v);  // the bf16 rounding of the residual stream
      if (i < n) *reinterpret_cast<uint4*>(xr + i * 8) = u[k];
    }
  }
  float ss = 0.0f;  // chunks past the row are zeros and add nothing
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    float v[8];
    bf16x8_unpack(u[k], v);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
  }
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(cols) + eps);
  bf16* orow = out + row * ld_out;
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i >= n) continue;
    *reinterpret_cast<uint4*>(orow + i * 8) = rmsnorm_apply8(u[k], w + 8 * i, r, zero_centred);
  }
}

// Two passes over the row (the second read hits L1/L2), V elements per access (8 or 1): rows too wide for
// the register kernel, or whose layout or weight pointer rules out its 16-byte accesses. With delta as above.
template <int V>
__global__ void rmsnorm_kernel(bf16* x, int64_t ld_x, const bf16* delta, int64_t ld_delta, const float* w,
                               bf16* out, int64_t ld_out, int64_t cols, float eps, bool zero_centred) {
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
                        int64_t ld_out, int64_t rows, int64_t cols, float eps, bool zero_centred,
                        cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  bool vec = cols % 8 == 0 && ld_x % 8 == 0 && ld_out % 8 == 0 && al(x) && al(out) &&
             (!delta || (ld_delta % 8 == 0 && al(delta)));
  const int64_t chunks = cols / 8;
  if (vec && al(w) && chunks <= int64_t(kRegMaxChunks) * kRegMaxThreads) {
    // Fewest chunks per thread that keeps the block at kRegThreads, then the block trimmed to a whole number
    // of warps that still covers the row (block_sum needs whole warps).
    const int nc =
        static_cast<int>(std::clamp<int64_t>((chunks + kRegThreads - 1) / kRegThreads, 1, kRegMaxChunks));
    const unsigned threads = static_cast<unsigned>(((chunks + nc - 1) / nc + 31) / 32 * 32);
    using Kernel = decltype(&rmsnorm_reg_kernel<1>);
    constexpr Kernel by_chunks[kRegMaxChunks] = {
        rmsnorm_reg_kernel<1>, rmsnorm_reg_kernel<2>, rmsnorm_reg_kernel<3>, rmsnorm_reg_kernel<4>,
        rmsnorm_reg_kernel<5>, rmsnorm_reg_kernel<6>, rmsnorm_reg_kernel<7>, rmsnorm_reg_kernel<8>};
    by_chunks[nc - 1]<<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, ld_x, delta, ld_delta, w, out,
                                                                           ld_out, cols, eps, zero_centred);
    DF_CUDA_CHECK_LAUNCH("rmsnorm_reg_kernel");
    return;
  }
  int64_t per_thread_items = vec ? chunks : cols;
  unsigned threads = per_thread_items >= 512 ? 256 : (per_thread_items >= 128 ? 128 : 32);
  if (vec)
    rmsnorm_kernel<8><<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, ld_x, delta, ld_delta, w, out,
                                                                           ld_out, cols, eps, zero_centred);
  else
    rmsnorm_kernel<1><<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, ld_x, delta, ld_delta, w, out,
                                                                           ld_out, cols, eps, zero_centred);
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
