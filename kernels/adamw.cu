// The drafter's optimizer step on the flat f32 parameter buffers: fused AdamW with the bf16 GEMM-weight
// shadow refreshed in the same pass, and the fixed-order sum of squares behind gradient clipping. Both
// reproduce the CPU backend (ops/cpu/cpu_train_ops.cpp) bit for bit: explicitly rounded fp32/double
// operations (no FMA contraction, no fast-math) in the CPU's order, and a reduction tree that depends on n
// only.
#include "kernels/cuda_check.cuh"
#include "kernels/launchers.cuh"

namespace df {

// Sum-of-squares geometry: a fixed grid whatever the GPU, so every device sums in the same order.
constexpr int kSsqThreads = 256;
constexpr int kSsqMaxBlocks = 1024;

static int ssq_blocks(int64_t n) {
  const int64_t b = (n + kSsqThreads - 1) / kSsqThreads;
  return static_cast<int>(b < kSsqMaxBlocks ? (b > 0 ? b : 1) : kSsqMaxBlocks);
}

// ---- kernels ----
// CPU: m = β1·m + (1 − β1)·g; v = β2·v + ((1 − β2)·g)·g in fp32; upd = (m / bc1) / (sqrt(v / bc2) + eps) and
// p − lr·(upd + wd·p) in double. The _rn intrinsics keep nvcc from fusing or approximating any of it.
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, bf16* p_lp, int64_t n,
                             AdamWArgs a) {
  const float omb1 = __fsub_rn(1.0f, a.beta1), omb2 = __fsub_rn(1.0f, a.beta2);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float gi = __fmul_rn(g[i], a.grad_scale);
    const float mi = __fadd_rn(__fmul_rn(a.beta1, m[i]), __fmul_rn(omb1, gi));
    const float vi = __fadd_rn(__fmul_rn(a.beta2, v[i]), __fmul_rn(__fmul_rn(omb2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    const double den = __dadd_rn(__dsqrt_rn(__ddiv_rn(double(vi), a.bc2)), double(a.eps));
    const double upd = __ddiv_rn(__ddiv_rn(double(mi), a.bc1), den);
    const double pi = p[i];
    const double decay = i < a.n_decay ? __dmul_rn(double(a.weight_decay), pi) : 0.0;
    const float pn = __double2float_rn(__dsub_rn(pi, __dmul_rn(double(a.lr), __dadd_rn(upd, decay))));
    p[i] = pn;
    if (p_lp) p_lp[i] = __float2bfloat16_rn(pn);
  }
}

// Tree sum of one double per thread over the block (kSsqThreads), fixed shape: the same order every call.
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
  const int64_t b = (n + 255) / 256;
  adamw_kernel<<<static_cast<unsigned>(b < 65535 * 8 ? b : 65535 * 8), 256, 0, stream>>>(p, g, m, v, p_lp, n,
                                                                                         a);
  DF_CUDA_CHECK_LAUNCH("adamw_kernel");
}

size_t sum_squares_workspace_bytes(int64_t n) {
  return size_t(ssq_blocks(n)) * sizeof(double);
}

void sum_squares_launch(const float* x, int64_t n, double* result, void* ws, size_t ws_bytes,
                        cudaStream_t stream) {
  if (ws_bytes < sum_squares_workspace_bytes(n))
    cuda_throw("sum_squares_launch", "workspace smaller than sum_squares_workspace_bytes", __FILE__,
               __LINE__);
  const int blocks = ssq_blocks(n);
  double* partial = static_cast<double*>(ws);
  sum_squares_kernel<<<blocks, kSsqThreads, 0, stream>>>(x, n, partial);
  DF_CUDA_CHECK_LAUNCH("sum_squares_kernel");
  sum_squares_final_kernel<<<1, kSsqThreads, 0, stream>>>(partial, blocks, result);
  DF_CUDA_CHECK_LAUNCH("sum_squares_final_kernel");
}

}  // namespace df
