// WirePool: the fixed set of buffers a rank's feature channel moves batches through (pipeline.hs_queue_depth
// slots, each sized for one batch at data.token_budget). A slot lives in the backend's memory, so a CUDA
// target's forward writes its taps straight into it and a CUDA drafter trains from it in place; on a device
// backend each slot also has a pinned host mirror that the MPI wire reads or fills, copied on a stream of its
// own so the compute stream never waits for the wire; the NCCL wire moves the device bytes itself and needs
// no mirror. Allocated once: no allocation per batch.
#pragma once
#include <cstddef>
#include <memory>

#include "core/tensor.h"

namespace df {

// Where a batch's payload sits in a wire slot: features [T, feat_cols] at byte 0, the final hidden
// [T, final_cols] at final_offset (256-aligned, for the views kernels read), `bytes` in all.
struct WireLayout {
  static size_t final_offset(int64_t tokens, int64_t feat_cols) {
    return (size_t(tokens * feat_cols) * 2 + 255) / 256 * 256;
  }
  static size_t bytes(int64_t tokens, int64_t feat_cols, int64_t final_cols) {
    return final_offset(tokens, feat_cols) + size_t(tokens * final_cols) * 2;
  }
};

class WirePool {
 public:
  virtual ~WirePool() = default;
  int depth() const { return depth_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // The slot in backend memory (device on CUDA ranks, host on CPU ranks) and its host bytes (the same memory
  // on a host pool; a device pool made without mirrors has none and throws).
  virtual char* data(int slot) = 0;
  virtual char* host(int slot) = 0;
  // Queues data → host of the slot's first n bytes, after the work queued so far on the compute stream (the
  // forward that wrote it); returns at once. A host pool has nothing to copy.
  virtual void to_host(int slot, size_t n) = 0;
  // Queues host → data of the first n bytes after the compute stream's work queued so far (which may still
  // read the slot's previous batch); the compute stream's later work waits for the copy.
  virtual void to_device(int slot, size_t n) = 0;
  // True once the slot's last queued copy is complete (always on a host pool); wait() blocks until it is.
  virtual bool copied(int slot) = 0;
  virtual void wait(int slot) = 0;
  // For a wire that moves the device bytes itself on a stream of its own (NCCL): `stream` is that backend
  // stream (a cudaStream_t), `event` an event of the backend. stream_after_compute: the stream's next work
  // waits for the compute stream's work queued so far (the forward that wrote a slot, the training that still
  // reads one); compute_after: the compute stream's next work waits for `event`. A host pool has no streams.
  virtual void stream_after_compute(void* stream);
  virtual void compute_after(void* event);

 protected:
  WirePool(int depth, size_t bytes, Device device) : depth_(depth), bytes_(bytes), device_(device) {}

 private:
  int depth_;
  size_t bytes_;
  Device device_;
};

// Host slots (CPU ranks): plain aligned host memory, no copies.
std::unique_ptr<WirePool> wire_pool_host(int depth, size_t bytes);

}  // namespace df
