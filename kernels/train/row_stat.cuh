// The running statistics of a logits row that the loss kernels reduce (lm_head_loss.cu, domino_head.cu): its
// max, the lowest index holding it and Σ exp(z − max), merged across threads in a fixed order.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace df {

// Running statistics of a logits row over the elements seen so far: max m, the lowest index holding it, and
// Σ exp(z − m). Elements arrive in increasing index order per thread, so a strict > keeps the lowest index.
struct RowStat {
  float m;
  float s;
  int32_t am;
};

// exp(m − M) for merging a partial whose max is m into the max M; 0 for a partial that saw nothing.
__device__ __forceinline__ float stat_rescale(float m, float M) {
  return m == -INFINITY ? 0.0f : __expf(m - M);
}

__device__ __forceinline__ void row_stat_add(RowStat& st, float z, int32_t t) {
  if (z > st.m) {
    st.s *= __expf(st.m - z);
    st.m = z;
    st.am = t;
  }
  st.s += __expf(z - st.m);
}

__device__ __forceinline__ RowStat stat_merge(const RowStat& x, const RowStat& y) {
  const float M = fmaxf(x.m, y.m);
  const int32_t am = x.m > y.m ? x.am : (y.m > x.m ? y.am : min(x.am, y.am));
  return {M, x.s * stat_rescale(x.m, M) + y.s * stat_rescale(y.m, M), am};
}

__device__ __forceinline__ RowStat stat_shfl_down(const RowStat& v, int o) {
  return {__shfl_down_sync(0xffffffffu, v.m, o), __shfl_down_sync(0xffffffffu, v.s, o),
          __shfl_down_sync(0xffffffffu, v.am, o)};
}

// The block's merge of every thread's statistic, in a fixed tree order (so the same bits every run); the
// result is valid in thread 0. `scratch` holds one entry per warp.
template <class S>
__device__ S stat_block_reduce(S v, S* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1) v = stat_merge(v, stat_shfl_down(v, o));
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = scratch[lane < warps ? lane : 0];
    for (int o = 16; o > 0; o >>= 1) {
      const S w = stat_shfl_down(v, o);
      if (lane + o < warps) v = stat_merge(v, w);
    }
  }
  return v;
}

}  // namespace df
