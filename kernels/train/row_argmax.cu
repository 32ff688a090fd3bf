// row_argmax.cuh: one CTA reduces the row with row_stat.cuh's statistics (max and lowest index holding it).
#include <climits>

#include "kernels/primitives/cuda_check.cuh"
#include "kernels/train/row_argmax.cuh"
#include "kernels/train/row_stat.cuh"

namespace df {

namespace {

constexpr int kArgmaxThreads = 1024;

}  // namespace

__global__ void __launch_bounds__(kArgmaxThreads)
    row_argmax_kernel(const float* row, int64_t V, int32_t* out) {
  __shared__ RowStat red[32];
  RowStat st{-INFINITY, 0.0f, INT_MAX};
  for (int64_t t = threadIdx.x; t < V; t += blockDim.x) row_stat_add(st, row[t], int32_t(t));
  st = stat_block_reduce(st, red);
  if (threadIdx.x == 0) out[0] = st.am;
}

void row_argmax_launch(const float* row, int64_t V, int32_t* out, cudaStream_t stream) {
  DF_CHECK(V >= 1 && V <= INT_MAX, "row_argmax_launch: row length %lld outside [1, INT_MAX]", (long long)V);
  row_argmax_kernel<<<1, kArgmaxThreads, 0, stream>>>(row, V, out);
  DF_CUDA_CHECK_LAUNCH("row_argmax_kernel");
}

}  // namespace df
