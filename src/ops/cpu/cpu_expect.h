// The shape check of the CPU backend's head ops: a tensor must be contiguous host memory of one dtype and
// shape, or the op throws naming itself and the argument.
#pragma once
#include "core/error.h"
#include "core/tensor.h"

namespace df {

inline void cpu_expect(const Tensor& t, DType dt, int64_t rows, int64_t cols, const char* op, const char* what) {
  DF_CHECK(t.device == Device::cpu && t.dtype == dt && t.rows == rows && t.cols == cols && t.contiguous(),
           "%s: %s must be contiguous host %s [%lld, %lld], got %s %s", op, what, dtype_name(dt),
           (long long)rows, (long long)cols, dtype_name(t.dtype), t.shape_str().c_str());
}

}  // namespace df
