// The host side of the NCCL layer (comm/nccl_comm.h), which needs no GPU: the bounded poll every NCCL call
// ends in, and the failure message it throws. The GPU side is tests/gpu/test_nccl.cpp. A build without CUDA
// has no NCCL layer: one skipped test says so.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(NcclWait, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA/NCCL: no NCCL layer to test";
}
#else
#include <string>

#include "comm/nccl_comm.h"

using namespace df;

TEST(NcclWait, PollsUntilTheStateLeavesInProgress) {
  int calls = 0;
  bool timed_out = true;
  double waited = -1;
  const ncclResult_t r =
      nccl_poll([&] { return ++calls < 5 ? ncclInProgress : ncclSuccess; }, 0, &timed_out, &waited);
  EXPECT_EQ(r, ncclSuccess);
  EXPECT_EQ(calls, 5) << "polled past the first state that was not ncclInProgress, or stopped early";
  EXPECT_FALSE(timed_out);
  EXPECT_GE(waited, 0.0);
}

TEST(NcclWait, ReturnsTheFirstErrorAtOnce) {
  int calls = 0;
  bool timed_out = true;
  double waited = 0;
  const ncclResult_t r =
      nccl_poll([&] { return ++calls == 1 ? ncclInProgress : ncclRemoteError; }, 100, &timed_out, &waited);
  EXPECT_EQ(r, ncclRemoteError) << ncclGetErrorString(r);
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(timed_out) << "an error is not a timeout";
}

TEST(NcclWait, GivesUpAtTheBound) {
  // Never finishes: the poll must return once the bound has passed, and say so.
  bool timed_out = false;
  double waited = 0;
  int calls = 0;
  const ncclResult_t r = nccl_poll(
      [&] {
        ++calls;
        return ncclInProgress;
      },
      0.05, &timed_out, &waited);
  EXPECT_EQ(r, ncclInProgress);
  EXPECT_TRUE(timed_out);
  EXPECT_GE(waited, 0.05) << "gave up before the bound";
  EXPECT_GT(calls, 1);
}

TEST(NcclWait, NoBoundWaitsForTheEnd) {
  // timeout <= 0 means no bound: it keeps polling past any fixed count until the state changes.
  int calls = 0;
  bool timed_out = true;
  double waited = 0;
  EXPECT_EQ(nccl_poll([&] { return ++calls < 1000 ? ncclInProgress : ncclSuccess; }, -1, &timed_out, &waited),
            ncclSuccess);
  EXPECT_EQ(calls, 1000);
  EXPECT_FALSE(timed_out);
}

TEST(NcclWait, FailureMessageNamesRankPeerOperationStep) {
  NcclOpContext c;
  c.label = "drafters";
  c.self = "drafter 1 (world rank 3), rank 1 of 2, cuda:1";
  c.op = "gradient all-reduce";
  c.peers = "all 2 ranks";
  c.step = 41;
  const std::string timeout = nccl_failure_message(c, ncclInProgress, true, 30.2, 30.0, "");
  for (const char* part : {"gradient all-reduce", "drafters communicator", "in step 41",
                           "drafter 1 (world rank 3)", "peers: all 2 ranks",
                           "not finished after 30.2 s (bound 30.0 s)", "aborted", "HINT:", "run.watchdog_s"})
    EXPECT_NE(timeout.find(part), std::string::npos) << "missing \"" << part << "\" in: " << timeout;
  EXPECT_EQ(timeout.find("NCCL says"), std::string::npos)
      << "an empty ncclGetLastError is left out: " << timeout;

  c.step = -1;
  const std::string error = nccl_failure_message(c, ncclSystemError, false, 0.5, 30.0, "socket closed");
  for (const char* part :
       {"at start-up", ncclGetErrorString(ncclSystemError), "NCCL says: socket closed", "NCCL_DEBUG=INFO"})
    EXPECT_NE(error.find(part), std::string::npos) << "missing \"" << part << "\" in: " << error;
  EXPECT_EQ(error.find("not finished"), std::string::npos)
      << "an error is not reported as a timeout: " << error;
}
#endif
