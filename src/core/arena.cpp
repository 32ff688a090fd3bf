// Bump allocator over one block, and the aligned host buffer that backs CPU arenas.
#include "core/arena.h"

#include <cstdlib>
#include <cstring>
#include <utility>

namespace df {

void* Arena::alloc_bytes(size_t bytes) {
  size_t start = (used_ + kAlign - 1) / kAlign * kAlign;
  size_t end = start + bytes;
  if (!counting())
    DF_CHECK(end <= capacity_, "arena out of memory: need %zu bytes, capacity %zu (planned size too small)", end,
             capacity_);
  used_ = end;
  if (used_ > high_) high_ = used_;
  return counting() ? nullptr : static_cast<char*>(base_) + start;
}

Tensor Arena::alloc(DType dtype, int64_t rows, int64_t cols) {
  void* p = alloc_bytes(static_cast<size_t>(rows * cols) * dtype_size(dtype));
  return tensor_make(p, dtype, device_, rows, cols);
}

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  size_t rounded = (bytes + Arena::kAlign - 1) / Arena::kAlign * Arena::kAlign;
  data_ = std::aligned_alloc(Arena::kAlign, rounded);
  DF_CHECK(data_ != nullptr, "host allocation of %zu bytes failed", bytes);
  std::memset(data_, 0, rounded);
}

HostBuffer::~HostBuffer() { std::free(data_); }

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

}  // namespace df
