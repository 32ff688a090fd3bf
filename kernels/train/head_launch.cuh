// What the drafter heads' kernels and launchers share (domino_head.cu, dspark_head.cu, dspark_markov.cu,
// dflash2_conv.cu, dflash2_selector.cu): the
// element-wise grid, the logistic function, and the carving of the op's workspace (its layout in
// train_workspace.h or dspark_workspace.h) with the check that the caller sized it so.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/train/train_workspace.h"
#include "kernels/train_launchers.cuh"

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

// The statistics rows a head's loss kernel writes and loss_row_stats reads (with given weights), slot k of
// block j at row j·B + (k + shift) mod B: the accuracy counts then fall on block offsets as DFlash's do, and
// a slot past offset B − 1 (shift 1) lands on offset 0, whose loss and weight are summed but whose accuracy
// is not counted.
struct HeadStatRows {
  float* loss;
  float* w;
  int32_t* lab;
  int32_t* am;
  uint8_t* act;
  int B, shift;

  __device__ int64_t row_of(int64_t r) const { return (r / B) * B + (r % B + shift) % B; }
  // Slot r's loss l (unweighted), weight wt, label and argmax; a weightless slot is put as inactive.
  __device__ void put(int64_t r, float l, float wt, int32_t label, int32_t argmax) const {
    const int64_t o = row_of(r);
    loss[o] = l;
    w[o] = wt;
    lab[o] = label;
    am[o] = argmax;
    act[o] = wt != 0.0f;
  }
};

// The rows the op's layout carved at `o` (train_workspace.h head_stat_offsets_take) in the workspace.
inline HeadStatRows head_stat_rows(void* ws, const HeadStatOffsets& o, int B, int shift) {
  return {at<float>(ws, o.loss), at<float>(ws, o.w), at<int32_t>(ws, o.lab), at<int32_t>(ws, o.am),
          at<uint8_t>(ws, o.act), B, shift};
}

// Adds the statistics of nb blocks of these rows to stats (loss_row_stats with the given weights).
inline void head_stats_launch(const HeadStatRows& s, int64_t nb, double* stats, cudaStream_t stream) {
  LossRowDims d;
  d.nb = nb;
  d.block = s.B;
  d.weights_given = true;
  loss_row_stats_launch(s.lab, s.act, s.loss, s.loss, s.am, d, s.w, stats, stream);
}

}  // namespace df::head_launch
