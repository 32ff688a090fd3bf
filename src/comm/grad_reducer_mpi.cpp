// MPI all-reduce among drafters. Large buffers go in slices below 2^31 elements (MPI counts are int).
#include <algorithm>

#include "core/error.h"
#include "comm/grad_reducer.h"

namespace df {

namespace {

class MpiReducer final : public GradReducer {
 public:
  explicit MpiReducer(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  void sum(float* data, size_t n) override { reduce(data, n, MPI_FLOAT); }
  void sum(double* data, size_t n) override { reduce(data, n, MPI_DOUBLE); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

 private:
  template <class T>
  void reduce(T* data, size_t n, MPI_Datatype type) {
    if (size_ == 1) return;
    constexpr size_t kSlice = size_t(1) << 30;
    for (size_t off = 0; off < n; off += kSlice) {
      int count = int(std::min(kSlice, n - off));
      int rc = MPI_Allreduce(MPI_IN_PLACE, data + off, count, type, MPI_SUM, comm_);
      DF_CHECK(rc == MPI_SUCCESS, "MPI_Allreduce over %d drafters failed (code %d)", size_, rc);
    }
  }
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<GradReducer> grad_reducer_mpi(MPI_Comm drafter_comm) {
  DF_CHECK(drafter_comm != MPI_COMM_NULL, "grad reducer on a rank that is not a drafter");
  return std::make_unique<MpiReducer>(drafter_comm);
}

}  // namespace df
