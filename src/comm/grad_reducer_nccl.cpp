// The reducers over DEVICE gradients (grad_reducer.h): NCCL on the drafters' communicator, and, for the MPI
// transport, MPI through one pinned host buffer. Only compiled with CUDA. Both keep the step statistics
// (host doubles) on the MPI reducer.
#include "core/error.h"
#include "comm/grad_reducer.h"
#include "comm/nccl_comm.h"
#include "kernels/primitives/cuda_check.cuh"

namespace df {

namespace {

class NcclReducer final : public GradReducer {
 public:
  NcclReducer(NcclComm& comm, cudaStream_t compute, MPI_Comm drafter_comm)
      : comm_(comm), compute_(compute), host_(grad_reducer_mpi(drafter_comm)) {
    DF_CHECK(host_->size() == comm_.size(), "NCCL drafters communicator has %d ranks but the MPI one %d",
             comm_.size(), host_->size());
    DF_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  }
  ~NcclReducer() override { cudaEventDestroy(ready_); }
  void sum(float* data, size_t n) override {
    DF_CUDA_CHECK(cudaEventRecord(ready_, compute_));
    comm_.wait_for(ready_);
    comm_.all_reduce_sum(data, n, "gradient all-reduce");
    DF_CUDA_CHECK(cudaStreamWaitEvent(compute_, comm_.record(), 0));
    comm_.synchronize("gradient all-reduce");
  }
  void sum(double* data, size_t n) override { host_->sum(data, n); }
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }

 private:
  NcclComm& comm_;
  cudaStream_t compute_;
  std::unique_ptr<GradReducer> host_;
  cudaEvent_t ready_ = nullptr;
};

class StagedReducer final : public GradReducer {
 public:
  StagedReducer(MPI_Comm drafter_comm, cudaStream_t compute, size_t max_n)
      : compute_(compute), max_n_(max_n), host_(grad_reducer_mpi(drafter_comm)) {
    // One drafter reduces nothing: no buffer.
    if (host_->size() > 1) {
      const cudaError_t e = cudaMallocHost(&pinned_, max_n * sizeof(float));
      DF_CHECK(e == cudaSuccess,
               "cudaMallocHost of %zu bytes for the gradient staging buffer failed: %s; HINT: "
               "pinned memory is limited by `ulimit -l` and the host's RAM",
               max_n * sizeof(float), cudaGetErrorString(e));
    }
  }
  ~StagedReducer() override { cudaFreeHost(pinned_); }  // synchronises: no copy is left in flight
  void sum(float* data, size_t n) override {
    DF_CHECK(n <= max_n_, "gradient all-reduce of %zu floats, but the staging buffer holds %zu", n, max_n_);
    if (host_->size() == 1) return;
    DF_CUDA_CHECK(cudaMemcpyAsync(pinned_, data, n * sizeof(float), cudaMemcpyDeviceToHost, compute_));
    DF_CUDA_CHECK(cudaStreamSynchronize(compute_));
    host_->sum(pinned_, n);
    // Not waited for: the stream orders it before the next step's kernels and before the next copy down, the
    // only thing that writes the buffer again.
    DF_CUDA_CHECK(cudaMemcpyAsync(data, pinned_, n * sizeof(float), cudaMemcpyHostToDevice, compute_));
  }
  void sum(double* data, size_t n) override { host_->sum(data, n); }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

 private:
  cudaStream_t compute_;
  size_t max_n_;
  std::unique_ptr<GradReducer> host_;
  float* pinned_ = nullptr;
};

}  // namespace

std::unique_ptr<GradReducer> grad_reducer_nccl(NcclComm& drafters, cudaStream_t compute,
                                               MPI_Comm drafter_comm) {
  return std::make_unique<NcclReducer>(drafters, compute, drafter_comm);
}

std::unique_ptr<GradReducer> grad_reducer_staged(MPI_Comm drafter_comm, cudaStream_t compute, size_t max_n) {
  return std::make_unique<StagedReducer>(drafter_comm, compute, max_n);
}

}  // namespace df
