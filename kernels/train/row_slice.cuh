// A logits row split over a cluster of CTAs, each owning a slice of its float4 columns, read twice (the
// statistics, then the gradient from L2): what the chunked lm_head loss kernels share (lm_head_loss.cu,
// dflash2_selector.cu) — the launch shape, the cluster barrier, a partner CTA's shared partial and the
// slice walk.
#pragma once
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/dispatch/dispatch.h"

namespace df::row_slice {

// 256 threads a CTA, so that several CTAs share an SM and one's loads stream while another waits at its
// cluster barriers (about 5 % faster than one 1024-thread CTA per SM at the 8B and 27B shapes, bench_kernels
// lm).
constexpr int kThreads = 256;
// A row is split over a cluster of up to 8 CTAs (the portable cluster size), each owning a slice of the
// vocabulary, so that the second pass over a slice finds it in L2: a 124 KB slice at V = 248,320, about
// 5 CTAs per SM, 80 MB over 132 SMs at most (less in practice: the CTAs of an SM are at different passes),
// where a whole row per CTA would be 650 MB.
constexpr int kMaxCluster = 8;
// Elements per thread below which a row is not split further (the exchange costs two cluster barriers).
constexpr int64_t kMinPerThread = 8;

// Loads per thread issued before any is used, enough bytes in flight per SM to stream at HBM speed (the KL
// reads two rows, so half as many of each).
template <bool KL>
constexpr int kUnroll = KL ? 2 : 4;

// The cluster's barrier (a block barrier when the row has one CTA).
__device__ __forceinline__ void row_sync(int ctas) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (ctas > 1) {
    cooperative_groups::this_cluster().sync();
    return;
  }
#endif
  __syncthreads();
}

// CTA `rank`'s copy of the shared object *p as seen from here.
template <class S>
__device__ __forceinline__ S* row_partial(S* p, int rank, int ctas) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (ctas > 1) return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#endif
  return p;  // one CTA per row: rank is 0
}

// The float4 columns [q0, q1) of a row of V logits that CTA `rank` of `ctas` owns.
__device__ __forceinline__ void slice_of(int64_t V, int rank, int ctas, int64_t& q0, int64_t& q1) {
  const int64_t V4 = (V + 3) / 4, per = (V4 + ctas - 1) / ctas;
  q0 = min(V4, rank * per);
  q1 = min(V4, q0 + per);
}

// Calls f(qu, live, z, y) with the four logits z (and target logits y) of the float4 columns qu of the slice
// [q0, q1) that this thread owns, in increasing order, U loads issued before any is used. Every thread of the
// block takes the same number of steps (live false past the slice's end, z and y then zero), so f may use
// warp collectives. `last` marks the slice's second pass: its loads evict first, keeping L2 for the slices
// still in their first pass.
template <int U, bool KL, class F>
__device__ __forceinline__ void slice_for_each(const float4* z4, const float4* y4, int64_t q0, int64_t q1,
                                               bool last, F&& f) {
  for (int64_t qb = q0; qb < q1; qb += int64_t(blockDim.x) * U) {
    const int64_t q = qb + threadIdx.x;
    float4 zb[U], yb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t qu = q + int64_t(u) * blockDim.x;
      zb[u] = yb[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (qu < q1) {
        zb[u] = last ? __ldcs(z4 + qu) : __ldcg(z4 + qu);
        if constexpr (KL) yb[u] = last ? __ldcs(y4 + qu) : __ldcg(y4 + qu);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t qu = q + int64_t(u) * blockDim.x;
      const float zv[4] = {zb[u].x, zb[u].y, zb[u].z, zb[u].w}, yv[4] = {yb[u].x, yb[u].y, yb[u].z, yb[u].w};
      f(qu, qu < q1, zv, yv);
    }
  }
}

// The launch of `ctas` CTAs of kThreads per row over n rows with `smem` dynamic shared bytes; the cluster
// attribute only when ctas > 1.
inline cudaLaunchConfig_t row_config(int ctas, int64_t n, size_t smem, cudaStream_t stream,
                                     cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(n * ctas));
  cfg.blockDim = dim3(unsigned(kThreads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  *attr = cudaLaunchAttribute{};
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = unsigned(ctas);
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = ctas > 1 ? 1 : 0;
  return cfg;
}

// CTAs that split one row of V logits for `kernel`: as many as the row has work for, up to kMaxCluster and
// the cluster size the device launches (lm_row_ctas_choose: 1 without clusters). A cluster's CTAs run at once
// inside one GPC, so it is halved until the occupancy calculator finds room for one (a MIG slice or a smaller
// part can have fewer than 8 SMs free per GPC).
template <class Kernel>
int row_cluster_size(Kernel kernel, int64_t V, size_t smem) {
  const int64_t per_cta = kThreads * kMinPerThread;
  int ctas = lm_row_ctas_choose(device_caps(),
                                int(std::clamp<int64_t>((V + per_cta - 1) / per_cta, 1, kMaxCluster)));
  for (; ctas > 1; ctas /= 2) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = row_config(ctas, 1, smem, nullptr, &attr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0) break;
    cudaGetLastError();  // a refusal is an answer here, not an error to leave pending
  }
  return ctas;
}

}  // namespace df::row_slice
