// Gradient all-reduce among drafter ranks: one call over the flat gradient buffer (and one over the step's
// loss statistics). MPI here; the NCCL implementation serves GPU ranks through the same interface.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>

namespace df {

class GradReducer {
 public:
  virtual ~GradReducer() = default;
  virtual void sum(float* data, size_t n) = 0;   // in place, over all drafters
  virtual void sum(double* data, size_t n) = 0;  // in place, over all drafters
  virtual int rank() const = 0;
  virtual int size() const = 0;
};

std::unique_ptr<GradReducer> grad_reducer_mpi(MPI_Comm drafter_comm);

}  // namespace df
