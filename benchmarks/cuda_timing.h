// Event timing shared by the CUDA benchmarks: one definition of "the median of N timed runs after two warm-up
// runs" (the warm-ups absorb cuBLASLt's per-shape tuning and module loads), so every printed rate means the same.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "kernels/primitives/cuda_check.cuh"

namespace df {

// Median of `reps` event-timed runs of fn on `stream` after two untimed ones, in ms. before, when given, runs
// untimed ahead of every run of fn with no sync in between (e.g. GEMMs, so fn runs at the clock a forward
// leaves it, not the one an idle GPU bursts to).
inline double cuda_median_ms(cudaStream_t stream, const std::function<void()>& fn, int reps,
                             const std::function<void()>& before = nullptr) {
  for (int i = 0; i < 2; ++i) {
    if (before) before();
    fn();
  }
  cudaEvent_t a, b;
  DF_CUDA_CHECK(cudaEventCreate(&a));
  DF_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    if (before) before();
    DF_CUDA_CHECK(cudaEventRecord(a, stream));
    fn();
    DF_CUDA_CHECK(cudaEventRecord(b, stream));
    DF_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    DF_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace df
