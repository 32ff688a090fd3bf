// pipeline.transport: auto takes NCCL exactly when every rank owns a distinct GPU (per host), MPI for CPU runs and
// ranks sharing a GPU; an explicit "nccl" that cannot work is an error saying why; bad values name the key; ranks
// that share a GPU each with its own NCCL_HOSTID get NCCL only when asked, and the choice says it is a test mode.
#include <gtest/gtest.h>

#include "core/error.h"
#include "comm/transport.h"

namespace df {
namespace {

TransportChoice choose(const std::string& setting, const std::vector<std::string>& hosts, const std::vector<int>& gpus,
                       bool built, const std::vector<std::string>& ids = {}) {
  return transport_choose(setting, TransportRanks{hosts, gpus, ids}, built);
}

std::string error_of(const std::string& setting, const std::vector<std::string>& hosts, const std::vector<int>& gpus,
                     bool built, const std::vector<std::string>& ids = {}) {
  try {
    choose(setting, hosts, gpus, built, ids);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Transport, AutoPicksNcclOnlyForOneGpuPerRank) {
  TransportChoice c = choose("auto", {"a", "a", "b", "b"}, {0, 1, 0, 1}, true);
  EXPECT_EQ(c.transport, Transport::nccl);
  EXPECT_EQ(c.why, "auto: every rank owns a distinct GPU");
  EXPECT_EQ(c.test_mode, "");
  c = choose("auto", {"a", "a"}, {0, 0}, true);
  EXPECT_EQ(c.transport, Transport::mpi);
  EXPECT_NE(c.why.find("ranks 0 and 1 share GPU 0 of a"), std::string::npos) << c.why;
  c = choose("auto", {"a", "a"}, {-1, -1}, true);
  EXPECT_EQ(c.transport, Transport::mpi);
  EXPECT_EQ(c.why, "auto: every rank runs on the CPU");
  c = choose("auto", {"a", "a", "a", "b"}, {0, -1, -1, 0}, true);  // the CPU ranks named, all of them
  EXPECT_EQ(c.transport, Transport::mpi);
  EXPECT_EQ(c.why, "auto: ranks 1, 2 run on the CPU");
  c = choose("auto", {"a", "b"}, {-1, 0}, true);
  EXPECT_EQ(c.why, "auto: rank 0 runs on the CPU");
  c = choose("auto", {"a", "b"}, {0, 0}, false);
  EXPECT_EQ(c.transport, Transport::mpi);
  EXPECT_NE(c.why.find("without CUDA/NCCL"), std::string::npos) << c.why;
  EXPECT_EQ(choose("mpi", {"a", "b"}, {0, 0}, true).transport, Transport::mpi);
  EXPECT_EQ(choose("nccl", {"a", "b"}, {0, 0}, true).transport, Transport::nccl);  // GPU 0 of two hosts
}

TEST(Transport, SharedGpuWithOneHostIdPerRankIsNcclTestModeOnlyWhenAsked) {
  const std::vector<std::string> hosts(4, "h");
  const std::vector<int> one_gpu(4, 0);
  const std::vector<std::string> ids = {"h-r0", "h-r1", "h-r2", "h-r3"};
  TransportChoice c = choose("nccl", hosts, one_gpu, true, ids);
  EXPECT_EQ(c.transport, Transport::nccl);
  EXPECT_EQ(c.test_mode, "NCCL over sockets: ranks share GPU 0 (test mode)");
  EXPECT_NE(c.why.find("ranks 0, 1, 2, 3 share GPU 0 of h"), std::string::npos) << c.why;
  EXPECT_EQ(c.warning, "");
  // auto stays on MPI: the socket path is a test of NCCL, never a silent choice for a real run.
  c = choose("auto", hosts, one_gpu, true, ids);
  EXPECT_EQ(c.transport, Transport::mpi);
  EXPECT_NE(c.why.find("test mode: transport \"nccl\""), std::string::npos) << c.why;
  // Two GPUs shared by two ranks each.
  c = choose("nccl", hosts, {0, 0, 1, 1}, true, ids);
  EXPECT_EQ(c.test_mode, "NCCL over sockets: ranks share GPU 0, 1 (test mode)");
  EXPECT_NE(c.warning.find("NCCL treats them as separate hosts"), std::string::npos) << c.warning;
  // One rank without an id, or two with the same one: refused as without ids, naming the pair.
  std::string e = error_of("nccl", hosts, one_gpu, true, {"h-r0", "h-r1", "", "h-r3"});
  EXPECT_NE(e.find("ranks 0 and 2 share GPU 0 of h"), std::string::npos) << e;
  EXPECT_NE(e.find("NCCL_HOSTID (launch/nccl_hostid.sh)"), std::string::npos) << e;
  e = error_of("nccl", hosts, one_gpu, true, {"x", "y", "y", "z"});
  EXPECT_NE(e.find("ranks 1 and 2 share GPU 0 of h"), std::string::npos) << e;
  EXPECT_NE(e.find("both have NCCL_HOSTID=y"), std::string::npos) << e;
  EXPECT_NE(error_of("nccl", {"h", "h"}, {0, 0}, true).find("ranks 0 and 1 share GPU 0"), std::string::npos);
  // Distinct GPUs, distinct ids: NCCL but warned (no NVLink between "hosts").
  c = choose("auto", {"h", "h"}, {0, 1}, true, {"a", "b"});
  EXPECT_EQ(c.transport, Transport::nccl);
  EXPECT_EQ(c.test_mode, "");
  EXPECT_NE(c.warning.find("not NVLink"), std::string::npos) << c.warning;
  // The same id everywhere (a site's own setting) is no warning.
  EXPECT_EQ(choose("auto", {"h", "h"}, {0, 1}, true, {"a", "a"}).warning, "");
}

TEST(Transport, ExplicitNcclThatCannotWorkAndBadValuesAreErrors) {
  EXPECT_NE(error_of("nccl", {"a", "a"}, {3, 3}, true).find("ranks 0 and 1 share GPU 3"), std::string::npos);
  EXPECT_NE(error_of("nccl", {"a"}, {0}, false).find("built without CUDA/NCCL"), std::string::npos);
  EXPECT_NE(error_of("gloo", {"a"}, {0}, true).find("pipeline.transport = \"gloo\""), std::string::npos);
}

}  // namespace
}  // namespace df
