// Arena: one block, bump allocation, reset to a mark. Activation memory is planned once for the
// token budget by running the allocation sequence against a counting arena (base == nullptr), then
// allocated for real; nothing is allocated per layer or per batch.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace df {

class Arena {
 public:
  Arena() = default;
  // base == nullptr makes a counting arena: alloc returns null views and only tracks the high-water mark.
  Arena(void* base, size_t capacity, Device device) : base_(base), capacity_(capacity), device_(device) {}

  Tensor alloc(DType dtype, int64_t rows, int64_t cols);
  void* alloc_bytes(size_t bytes);
  size_t mark() const { return used_; }
  void reset(size_t mark) { used_ = mark; }
  size_t used() const { return used_; }
  size_t high_water() const { return high_; }
  size_t capacity() const { return capacity_; }
  bool counting() const { return base_ == nullptr; }
  Device device() const { return device_; }

  static constexpr size_t kAlign = 256;  // cuBLASLt and vector loads want >= 16; 256 keeps rows coalesced

 private:
  void* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  size_t high_ = 0;
  Device device_ = Device::cpu;
};

// An owning host buffer, 256-byte aligned (for CPU arenas and host copies of weights).
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes);
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace df
