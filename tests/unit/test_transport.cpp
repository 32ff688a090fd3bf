// pipeline.transport: auto takes NCCL exactly when every rank owns a distinct GPU (per host), MPI for CPU runs and
// ranks sharing a GPU; an explicit "nccl" that cannot work is an error saying why; bad values name the key.
#include <gtest/gtest.h>

#include "core/error.h"
#include "dist/transport.h"

namespace df {
namespace {

std::string error_of(const std::string& setting, const std::vector<std::string>& hosts, const std::vector<int>& gpus,
                     bool built) {
  try {
    transport_choose(setting, hosts, gpus, built, nullptr);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Transport, AutoPicksNcclOnlyForOneGpuPerRank) {
  std::string why;
  EXPECT_EQ(transport_choose("auto", {"a", "a", "b", "b"}, {0, 1, 0, 1}, true, &why), Transport::nccl);
  EXPECT_EQ(why, "auto: every rank owns a distinct GPU");
  EXPECT_EQ(transport_choose("auto", {"a", "a"}, {0, 0}, true, &why), Transport::mpi);
  EXPECT_NE(why.find("ranks 0 and 1 share GPU 0 of a"), std::string::npos) << why;
  EXPECT_EQ(transport_choose("auto", {"a", "a"}, {-1, -1}, true, &why), Transport::mpi);
  EXPECT_NE(why.find("rank 0 runs on the CPU"), std::string::npos) << why;
  EXPECT_EQ(transport_choose("auto", {"a", "b"}, {0, 0}, false, &why), Transport::mpi);
  EXPECT_NE(why.find("without CUDA/NCCL"), std::string::npos) << why;
  EXPECT_EQ(transport_choose("mpi", {"a", "b"}, {0, 0}, true, &why), Transport::mpi);
  EXPECT_EQ(transport_choose("nccl", {"a", "b"}, {0, 0}, true, &why), Transport::nccl);  // GPU 0 of two hosts
}

TEST(Transport, ExplicitNcclThatCannotWorkAndBadValuesAreErrors) {
  EXPECT_NE(error_of("nccl", {"a", "a"}, {3, 3}, true).find("ranks 0 and 1 share GPU 3"), std::string::npos);
  EXPECT_NE(error_of("nccl", {"a"}, {0}, false).find("built without CUDA/NCCL"), std::string::npos);
  EXPECT_NE(error_of("gloo", {"a"}, {0}, true).find("pipeline.transport = \"gloo\""), std::string::npos);
}

}  // namespace
}  // namespace df
