// The CUDA WirePool (ops/wire_pool.h): device slots with pinned host mirrors (for the MPI wire), copied on
// the pool's own stream. Each copy first waits for the compute stream's work queued so far (an event), so a
// D2H reads the finished forward and an H2D never overwrites a slot a queued kernel still reads; after an H2D
// the compute stream waits for the copy. The host thread only blocks in wait(), never the compute stream. The
// NCCL wire orders its own stream against the compute stream through the same event.
#include <vector>

#include "kernels/primitives/cuda_check.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/wire_pool.h"

namespace df {

namespace {

class CudaWirePool final : public WirePool {
 public:
  CudaWirePool(const CudaDevice& dev, int depth, size_t bytes, bool mirrors)
      : WirePool(depth, bytes, Device::cuda), dev_(dev) {
    DF_CHECK(depth >= 1, "wire pool: needs at least one slot (pipeline.hs_queue_depth >= 1), got %d", depth);
    DF_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    DF_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
    for (int i = 0; i < depth; ++i) {
      Slot s;
      s.dev = static_cast<char*>(dev_.alloc(bytes));
      const cudaError_t e = mirrors ? cudaMallocHost(reinterpret_cast<void**>(&s.host), bytes) : cudaSuccess;
      DF_CHECK(e == cudaSuccess,
               "wire pool: cannot pin %d host buffers of %.1f MiB for GPU %d (%s); HINT: lower "
               "pipeline.hs_queue_depth or data.token_budget, or raise the locked-memory limit (ulimit -l)",
               depth, double(bytes) / (1 << 20), dev_.index, cudaGetErrorString(e));
      DF_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
      DF_CUDA_CHECK(cudaEventRecord(s.copied, copy_));  // a fresh slot counts as copied
      slots_.push_back(s);
    }
  }
  ~CudaWirePool() override {
    cudaStreamSynchronize(copy_);
    for (Slot& s : slots_) {
      cudaEventDestroy(s.copied);
      cudaFreeHost(s.host);
      dev_.free(s.dev);
    }
    cudaEventDestroy(compute_done_);
    cudaStreamDestroy(copy_);
  }

  char* data(int slot) override { return at(slot).dev; }
  char* host(int slot) override {
    Slot& s = at(slot);
    DF_CHECK(s.host != nullptr,
             "wire pool: slot %d has no host mirror (a pool for the NCCL wire; internal error)", slot);
    return s.host;
  }

  void to_host(int slot, size_t n) override {
    Slot& s = at(slot);
    host(slot);
    after_compute();
    if (n) DF_CUDA_CHECK(cudaMemcpyAsync(s.host, s.dev, checked(n), cudaMemcpyDeviceToHost, copy_));
    DF_CUDA_CHECK(cudaEventRecord(s.copied, copy_));
  }

  void to_device(int slot, size_t n) override {
    Slot& s = at(slot);
    host(slot);
    after_compute();
    if (n) DF_CUDA_CHECK(cudaMemcpyAsync(s.dev, s.host, checked(n), cudaMemcpyHostToDevice, copy_));
    DF_CUDA_CHECK(cudaEventRecord(s.copied, copy_));
    DF_CUDA_CHECK(cudaStreamWaitEvent(dev_.stream, s.copied, 0));
  }

  bool copied(int slot) override {
    const cudaError_t e = cudaEventQuery(at(slot).copied);
    if (e == cudaErrorNotReady) return false;
    DF_CUDA_CHECK(e);
    return true;
  }
  void wait(int slot) override { DF_CUDA_CHECK(cudaEventSynchronize(at(slot).copied)); }

  void stream_after_compute(void* stream) override {
    DF_CUDA_CHECK(cudaEventRecord(compute_done_, dev_.stream));
    DF_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), compute_done_, 0));
  }
  void compute_after(void* event) override {
    DF_CUDA_CHECK(cudaStreamWaitEvent(dev_.stream, static_cast<cudaEvent_t>(event), 0));
  }

 private:
  struct Slot {
    char* dev = nullptr;
    char* host = nullptr;
    cudaEvent_t copied = nullptr;
  };

  Slot& at(int slot) {
    DF_CHECK(slot >= 0 && slot < depth(), "wire pool: slot %d outside [0, %d)", slot, depth());
    return slots_[size_t(slot)];
  }
  size_t checked(size_t n) const {
    DF_CHECK(n <= bytes(), "wire pool: a copy of %zu bytes exceeds the %zu-byte slot", n, bytes());
    return n;
  }
  void after_compute() { stream_after_compute(copy_); }

  const CudaDevice& dev_;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;
  std::vector<Slot> slots_;
};

}  // namespace

std::unique_ptr<WirePool> cuda_wire_pool(const CudaDevice& dev, int depth, size_t bytes, bool mirrors) {
  return std::make_unique<CudaWirePool>(dev, depth, bytes, mirrors);
}

}  // namespace df
