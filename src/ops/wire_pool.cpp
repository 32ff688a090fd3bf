// The host WirePool (ops/wire_pool.h): CPU ranks' slots are host memory that the wire reads and writes in
// place, so every copy is a no-op.
#include "ops/wire_pool.h"

#include <cstdlib>
#include <vector>

#include "core/error.h"

namespace df {

namespace {

class HostWirePool final : public WirePool {
 public:
  HostWirePool(int depth, size_t bytes) : WirePool(depth, bytes, Device::cpu) {
    DF_CHECK(depth >= 1, "wire pool: needs at least one slot (pipeline.hs_queue_depth >= 1), got %d", depth);
    for (int i = 0; i < depth; ++i) {
      // 256-byte rows for the taps' views; aligned_alloc needs a multiple of the alignment.
      void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
      DF_CHECK(p != nullptr, "wire pool: cannot allocate %d host slots of %zu bytes", depth, bytes);
      slots_.push_back(static_cast<char*>(p));
    }
  }
  ~HostWirePool() override {
    for (char* p : slots_) std::free(p);
  }
  char* data(int slot) override { return slots_.at(size_t(slot)); }
  char* host(int slot) override { return slots_.at(size_t(slot)); }
  void to_host(int, size_t) override {}
  void to_device(int, size_t) override {}
  bool copied(int) override { return true; }
  void wait(int) override {}

 private:
  std::vector<char*> slots_;
};

}  // namespace

// Only a device pool has streams: the NCCL wire is chosen only when every rank is on a GPU.
void WirePool::stream_after_compute(void*) {
  DF_FAIL("host wire pool: no device stream to order (internal error)");
}
void WirePool::compute_after(void*) {
  stream_after_compute(nullptr);
}

std::unique_ptr<WirePool> wire_pool_host(int depth, size_t bytes) {
  return std::make_unique<HostWirePool>(depth, bytes);
}

}  // namespace df
