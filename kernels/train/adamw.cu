// The drafter's optimizer step on the flat f32 parameter buffers: fused AdamW with the bf16 GEMM-weight
// shadow refreshed in the same pass, and the fixed-order sum of squares behind gradient clipping. Both
// reproduce the CPU backend (ops/cpu/cpu_train_ops.cpp) bit for bit: explicitly rounded fp32/double
// operations (no FMA contraction, no fast-math) in the CPU's order, and a reduction tree that depends on n
// only.
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/launchers.cuh"

namespace df {

// ---- kernels ----
// CPU: m = β1·m + (1 − β1)·g; v = β2·v + ((1 − β2)·g)·g in fp32; upd = (m / bc1) / (sqrt(v / bc2) + eps) and
// p − lr·(upd + wd·p) in double. The _rn intrinsics keep nvcc from fusing or approximating any of it.
// One element's update, in exactly the CPU's order of f32 and double operations (bit-identical results).
__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v, bool decay,
                                              const AdamWArgs& a) {
  const float omb1 = __fsub_rn(1.0f, a.beta1), omb2 = __fsub_rn(1.0f, a.beta2);
  const float gi = __fmul_rn(g, a.grad_scale);
  const float mi = __fadd_rn(__fmul_rn(a.beta1, m), __fmul_rn(omb1, gi));
  const float vi = __fadd_rn(__fmul_rn(a.beta2, v), __fmul_rn(__fmul_rn(omb2, gi), gi));
  m = mi;
  v = vi;
  const double den = __dadd_rn(__dsqrt_rn(__ddiv_rn(double(vi), a.bc2)), double(a.eps));
  const double upd = __ddiv_rn(__ddiv_rn(double(mi), a.bc1), den);
  const double pi = p;
  const double dec = decay ? __dmul_rn(double(a.weight_decay), pi) : 0.0;
  p = __double2float_rn(__dsub_rn(pi, __dmul_rn(double(a.lr), __dadd_rn(upd, dec))));
}

// Four elements per thread through 16-byte loads (the pass is bound by its 30 bytes per element of traffic);
// the flat buffers are 64-element aligned, the tail of n % 4 elements is done one by one.
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, bf16* p_lp, int64_t n,
                             AdamWArgs a) {
  const int64_t n4 = n / 4;
  for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < n4; q += (int64_t)gridDim.x * blockDim.x) {
    float4 pp = reinterpret_cast<float4*>(p)[q], mm = reinterpret_cast<float4*>(m)[q];
    float4 vv = reinterpret_cast<float4*>(v)[q];
    const float4 gg = reinterpret_cast<const float4*>(g)[q];
    const int64_t i = 4 * q;
    adamw_element(pp.x, gg.x, mm.x, vv.x, i < a.n_decay, a);
    adamw_element(pp.y, gg.y, mm.y, vv.y, i + 1 < a.n_decay, a);
    adamw_element(pp.z, gg.z, mm.z, vv.z, i + 2 < a.n_decay, a);
    adamw_element(pp.w, gg.w, mm.w, vv.w, i + 3 < a.n_decay, a);
    reinterpret_cast<float4*>(p)[q] = pp;
    reinterpret_cast<float4*>(m)[q] = mm;
    reinterpret_cast<float4*>(v)[q] = vv;
    if (p_lp) {
      __nv_bfloat162 lo = __floats2bfloat162_rn(pp.x, pp.y), hi = __floats2bfloat162_rn(pp.z, pp.w);
      uint2 packed;
      packed.x = *reinterpret_cast<uint32_t*>(&lo);
      packed.y = *reinterpret_cast<uint32_t*>(&hi);
      reinterpret_cast<uint2*>(p_lp)[q] = packed;
    }
  }
  if (blockIdx.x == 0)
    for (int64_t i = 4 * n4 + threadIdx.x; i < n; i += blockDim.x) {
      float pi = p[i], mi = m[i], vi = v[i];
      adamw_element(pi, g[i], mi, vi, i < a.n_decay, a);
      p[i] = pi;
      m[i] = mi;
      v[i] = vi;
      if (p_lp) p_lp[i] = __float2bfloat16_rn(pi);
    }
}

__device__ double block_sum_double(double v) {
  __shared__ double part[kSsqThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = 0.0;
  if (threadIdx.x < 32) {
    t = threadIdx.x < kSsqThreads / 32 ? part[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  }
  return t;  // valid in thread 0
}

// Block b sums elements b·kSsqThreads + tid + k·(blocks·kSsqThreads) in double, then the block tree.
__global__ void __launch_bounds__(kSsqThreads)
    sum_squares_kernel(const float* x, int64_t n, double* partial) {
  double acc = 0.0;
  for (int64_t i = blockIdx.x * (int64_t)kSsqThreads + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * kSsqThreads) {
    const double xi = x[i];
    acc = __dadd_rn(acc, __dmul_rn(xi, xi));
  }
  acc = block_sum_double(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// One block: thread t adds partials t, t + kSsqThreads, ... in order, then the block tree.
__global__ void __launch_bounds__(kSsqThreads)
    sum_squares_final_kernel(const double* partial, int blocks, double* result) {
  double acc = 0.0;
  for (int b = threadIdx.x; b < blocks; b += kSsqThreads) acc += partial[b];
  acc = block_sum_double(acc);
  if (threadIdx.x == 0) *result = acc;
}

// ---- launchers ----
void adamw_launch(float* p, const float* g, float* m, float* v, bf16* p_lp, int64_t n, const AdamWArgs& a,
                  cudaStream_t stream) {
  if (n == 0) return;
  const bool aligned = (reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(g) |
                        reinterpret_cast<uintptr_t>(m) | reinterpret_cast<uintptr_t>(v)) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(p_lp) % 8 == 0;
  DF_CHECK(aligned, "adamw_launch: the flat buffers must be 16-byte aligned (the shadow 8-byte)");
  const int64_t b = (n / 4 + 255) / 256;
  adamw_kernel<<<static_cast<unsigned>(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8), 256, 0, stream>>>(
      p, g, m, v, p_lp, n, a);
  DF_CUDA_CHECK_LAUNCH("adamw_kernel");
}

void sum_squares_launch(const float* x, int64_t n, double* result, void* ws, size_t ws_bytes,
                        cudaStream_t stream) {
  if (ws_bytes < sum_squares_workspace_bytes(n))
    cuda_throw("sum_squares_launch", "workspace smaller than sum_squares_workspace_bytes", __FILE__,
               __LINE__);
  const int blocks = sum_squares_blocks(n);
  double* partial = static_cast<double*>(ws);
  sum_squares_kernel<<<blocks, kSsqThreads, 0, stream>>>(x, n, partial);
  DF_CUDA_CHECK_LAUNCH("sum_squares_kernel");
  sum_squares_final_kernel<<<1, kSsqThreads, 0, stream>>>(partial, blocks, result);
  DF_CUDA_CHECK_LAUNCH("sum_squares_final_kernel");
}

}  // namespace df
