// Backend copies of host rows for the GPU training-op tests (test_cuda_drafter.cpp, test_cuda_dflash2.cpp):
// uploads as f32, bf16 or the backend's activation dtype, downloads back to host vectors, frees with the
// owner.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "ops/train_ops.h"

namespace df::testing {

class Dev {
 public:
  explicit Dev(TrainOps& ops) : ops_(ops) {}
  ~Dev() {
    for (void* p : mem_) ops_.free_bytes(p);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  Tensor up(const std::vector<T>& h, DType dt, int64_t rows, int64_t cols) {
    mem_.push_back(ops_.alloc_bytes(size_t(std::max<int64_t>(1, rows * cols)) * dtype_size(dt)));
    Tensor t = tensor_make(mem_.back(), dt, ops_.device(), rows, cols);
    if (rows * cols > 0) ops_.upload_raw(t, h.data());
    return t;
  }
  Tensor bf16(const std::vector<float>& h, int64_t rows, int64_t cols) {
    std::vector<uint16_t> b(h.size());
    for (size_t i = 0; i < h.size(); ++i) b[i] = f32_to_bf16(h[i]);
    return up(b, DType::bf16, rows, cols);
  }
  // An activation or GEMM weight: the backend's act_dtype (bf16 on CUDA, f32 on the CPU).
  Tensor act(const std::vector<float>& h, int64_t rows, int64_t cols) {
    return ops_.act_dtype() == DType::f32 ? up(h, DType::f32, rows, cols) : bf16(h, rows, cols);
  }
  template <class T>
  std::vector<T> down(const Tensor& t) {
    std::vector<T> h(size_t(t.numel()) * dtype_size(t.dtype) / sizeof(T));
    if (!h.empty()) ops_.download_raw(t, h.data());
    return h;
  }
  // A bf16 or f32 tensor's values as f32.
  std::vector<float> f32(const Tensor& t) {
    if (t.dtype == DType::f32) return down<float>(t);
    const std::vector<uint16_t> b = down<uint16_t>(t);
    std::vector<float> f(b.size());
    for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
    return f;
  }

 private:
  TrainOps& ops_;
  std::vector<void*> mem_;
};

}  // namespace df::testing
