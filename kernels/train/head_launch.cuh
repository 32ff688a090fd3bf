// What the drafter heads' kernels and launchers share (domino_head.cu, dspark_head.cu, dspark_markov.cu, dflash2.cu): the
// element-wise grid, the logistic function, and the carving of the op's workspace (its layout in
// train_workspace.h or dspark_workspace.h) with the check that the caller sized it so.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "kernels/primitives/cuda_check.cuh"

namespace df::head_launch {

constexpr int kThreads = 256;      // element-wise and per-row kernels
constexpr int kRowThreads = 1024;  // the loss kernels' CTA over one logits row of the vocabulary

__device__ __forceinline__ float sigmoid_f(float x) {
  return 1.0f / (1.0f + expf(-x));
}

inline unsigned grid_of(int64_t n) {
  return unsigned((n + kThreads - 1) / kThreads);
}

inline void check_ws(const char* op, void* ws, size_t ws_bytes, size_t need) {
  DF_CHECK(ws && ws_bytes >= need && reinterpret_cast<uintptr_t>(ws) % 256 == 0,
           "%s: workspace %p of %zu bytes, needs %zu bytes 256-byte aligned (HINT: size it with the op's "
           "layout function, train_workspace.h or dspark_workspace.h, and the same arguments)",
           op, ws, ws_bytes, need);
}

// The piece of the workspace at byte offset off.
template <class T>
T* at(void* ws, size_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(ws) + off);
}

inline void zero(void* p, size_t bytes, cudaStream_t stream) {
  DF_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
}

}  // namespace df::head_launch
