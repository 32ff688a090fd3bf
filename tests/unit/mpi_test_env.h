// MPI for a GoogleTest binary: initialised before the first test and finalized after the last, in a singleton
// (ctest) or under mpirun. Include from one file of the binary.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

namespace df {

class MpiTestEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  void TearDown() override { MPI_Finalize(); }
};
inline int mpi_world_size() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return world;
}
inline const auto* const kMpiTestEnvironment = ::testing::AddGlobalTestEnvironment(new MpiTestEnvironment);

}  // namespace df
