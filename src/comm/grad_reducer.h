// Gradient all-reduce among drafter ranks: one call over the flat gradient buffer (and one over the step's
// loss statistics). Which memory `sum(float*)` takes depends on the implementation, named at each factory.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>
#ifdef DF_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace df {

class GradReducer {
 public:
  virtual ~GradReducer() = default;
  virtual void sum(float* data,
                   size_t n) = 0;  // in place, over all drafters; host or device: see the factory
  virtual void sum(double* data, size_t n) = 0;  // in place, over all drafters; always host memory
  virtual int rank() const = 0;
  virtual int size() const = 0;
};

// Host pointers, both sums over MPI (CPU drafters).
std::unique_ptr<GradReducer> grad_reducer_mpi(MPI_Comm drafter_comm);

#ifdef DF_HAVE_CUDA
class NcclComm;
// DEVICE pointers for sum(float*): an in-place NCCL all-reduce on the comm's stream, queued after the work on
// `compute` and with `compute` waiting for it; the host then waits for it within the comm's bound (so a hung
// drafter ends in a named NCCL error, not in an unbounded stream synchronize later). One all-reduce after the
// whole backward: no bucketing or overlap with the backward (not measured to pay yet). sum(double*) (a few
// host doubles of step statistics) stays on MPI over drafter_comm: NCCL would need them copied to the device
// and back for a message that costs microseconds either way.
std::unique_ptr<GradReducer> grad_reducer_nccl(NcclComm& drafters, cudaStream_t compute,
                                               MPI_Comm drafter_comm);
// DEVICE pointers for sum(float*), staged through one pinned host buffer of `max_n` floats allocated here
// (CUDA drafters on the MPI transport): copy down on `compute`, MPI all-reduce, copy back on `compute`.
std::unique_ptr<GradReducer> grad_reducer_staged(MPI_Comm drafter_comm, cudaStream_t compute, size_t max_n);
#endif

}  // namespace df
