// A tensor is a non-owning 2-D view (rows x cols with a row stride) over host or device memory.
// Two dimensions cover every activation and weight here; strided column views let q/k/v and the
// [q | gate] halves of a fused projection be used in place without copies.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace df {

enum class Device : uint8_t { cpu, cuda };

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // elements between consecutive rows; == cols when contiguous

  int64_t numel() const { return rows * cols; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool contiguous() const { return stride == cols || rows <= 1; }
  bool empty() const { return data == nullptr; }

  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // Row r's first element, as bytes (dtype-agnostic arithmetic for views).
  char* row_bytes(int64_t r) const { return static_cast<char*>(data) + r * stride * dtype_size(dtype); }

  // Columns [c0, c0+n) of every row, sharing memory.
  Tensor cols_view(int64_t c0, int64_t n) const;
  // Rows [r0, r0+n), sharing memory.
  Tensor rows_view(int64_t r0, int64_t n) const;
  // Same memory seen as another shape; requires a contiguous tensor with the same element count.
  Tensor reshape(int64_t r, int64_t c) const;
  std::string shape_str() const;
};

Tensor tensor_make(void* data, DType dtype, Device device, int64_t rows, int64_t cols);
// Whether the byte ranges of two views, first element to last with their strides, intersect: coarse, so two
// column views of one buffer that interleave count as overlapping. An empty view overlaps nothing.
bool tensor_spans_overlap(const Tensor& a, const Tensor& b);

}  // namespace df
