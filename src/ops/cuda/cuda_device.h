// What the two CUDA backends (CudaOps for the target, CudaTrainOps for the drafter) share: the device, its
// stream and cuBLASLt context, memory and copies, and the tensor checks whose messages name the op and the
// tensor. One copy of each, so both backends validate and move memory the same way.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"
#include "ops/wire_pool.h"

namespace df {

struct GemmContext;

// One device as a backend sees it: selected for the constructing thread, one non-blocking stream, one
// cuBLASLt context. Owns them; not copyable.
struct CudaDevice {
  explicit CudaDevice(int device);
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  void* alloc(size_t bytes) const;  // cudaMalloc; the message names the device and the size
  void free(void* p) const;
  // Host bytes of the tensor's own dtype, contiguous on the host; the device side may be a strided view.
  // Both synchronise the stream (the host buffer is free to reuse on return).
  void upload_raw(const Tensor& dst, const void* host) const;
  void download_raw(const Tensor& src, void* host) const;
  // Same shape; same dtype (any) or an f32/bf16 conversion; either side strided. Queued on the stream.
  void copy(const Tensor& src, const Tensor& dst) const;

  int index = 0;
  cudaStream_t stream = nullptr;
  GemmContext* gemm = nullptr;
};

// Non-empty CUDA memory of dtype dt; op and what name the call and the tensor in the message.
void cuda_expect(const Tensor& t, DType dt, const char* op, const char* what);
void cuda_expect_shape(const Tensor& t, int64_t rows, int64_t cols, const char* op, const char* what);
// Both: non-empty CUDA memory of dtype dt and shape [rows, cols].
void cuda_expect_as(const Tensor& t, DType dt, int64_t rows, int64_t cols, const char* op, const char* what);
// CUDA memory holding f32 or bf16.
void cuda_expect_float(const Tensor& t, const char* op, const char* what);

inline bool cuda_is_float(DType t) {
  return t == DType::f32 || t == DType::bf16;
}

// A tensor's device data as the element type the kernels take; the cuda_expect* checks above come first.
inline __nv_bfloat16* bptr(const Tensor& t) { return static_cast<__nv_bfloat16*>(t.data); }
inline float* fptr(const Tensor& t) { return static_cast<float*>(t.data); }
inline const int32_t* iptr(const Tensor& t) { return static_cast<const int32_t*>(t.data); }

// The ops both backends run with the same contract, checked and launched once here: out[t] = table[ids[t]]
// (ids i32 [1, T]; bf16 table and out), out = silu(gate)·up (bf16), and c = alpha·op(a)·op(b) + beta·c_in
// with bf16 a, b and bf16 or f32 c, c_in of c's dtype and shape, c itself or not overlapping it (gemm.cuh
// gemm_launch_addend; K = 0 with beta 1 copies c_in into c).
void cuda_embedding(const CudaDevice& dev, const Tensor& ids, const Tensor& table, const Tensor& out);
void cuda_swiglu(const CudaDevice& dev, const Tensor& gate, const Tensor& up, const Tensor& out);
void cuda_gemm(const CudaDevice& dev, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
               const Tensor& c_in, const Tensor& c, float alpha, float beta);
// A tensor's leading dimension for cuBLASLt: its row stride, at least its row length (a one-row view may carry
// any stride).
inline int64_t cuda_gemm_ld(const Tensor& t) { return t.stride > t.cols ? t.stride : t.cols; }

// The wire pool of a CUDA rank (ops/wire_pool.h): device slots of `bytes`, with pinned host mirrors for the
// MPI wire (mirrors) or without for the NCCL one, ordered against dev's stream.
std::unique_ptr<WirePool> cuda_wire_pool(const CudaDevice& dev, int depth, size_t bytes, bool mirrors);

// Number of CUDA devices visible, 0 when there is no driver or no GPU (never throws).
int cuda_device_count();

}  // namespace df
