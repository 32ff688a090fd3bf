// The NCCL layer on a real GPU (comm/nccl_comm.h, grad_reducer.h). Under ctest, one-rank communicators, so
// every sum is the identity and must be bit-exact: the all-reduce ordered against a caller's stream,
// send/receive to self, warm-up, both hang paths of the watchdog (a rank that never joins, a receive with no
// send) and the device gradient reducers. tests/gpu/test_nccl_reducers.sh runs the reducer and multi-rank
// cases again under mpirun -np 2 and 3 (one GPU per rank, or ranks sharing a GPU each with its own
// NCCL_HOSTID: the socket test mode), where every sum is N times the pattern and 64 MiB must cross each rank
// pair byte for byte.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(NcclTest, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA/NCCL: NCCL tests skipped";
}
#else
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "comm/grad_reducer.h"
#include "comm/nccl_comm.h"
#include "ops/cuda/cuda_device.h"
#include "tests/unit/mpi_test_env.h"  // MPI for the reducers' host statistics

using namespace df;

namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// Values exact in fp32 and all distinct, so a misplaced element shows: 0.25·i − 1000.
std::vector<float> pattern(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.25f * float(i % 65536) - 1000.0f + float(i / 65536);
  return v;
}

// First differing element, as "index i: got a, expected b (k of n differ)"; empty when equal.
std::string first_difference(const std::vector<float>& got, const std::vector<float>& want,
                             float scale = 1.0f) {
  size_t bad = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != scale * want[i] && bad++ == 0) first = i;
  if (bad == 0) return "";
  char buf[256];
  std::snprintf(buf, sizeof(buf), "index %zu of [%zu]: got %.9g, expected %.9g (%zu elements differ)", first,
                got.size(), got[first], scale * want[first], bad);
  return buf;
}

// Ends the process if a scenario hangs: the point of these tests is that nothing hangs, and a hung ctest
// case would only say "timeout" without naming which NCCL path failed to come back.
class HangGuard {
 public:
  HangGuard(const char* what, double seconds) : what_(what) {
    thread_ = std::thread([this, seconds] {
      const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
      while (!done_.load() && std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (!done_.load()) {
        std::fprintf(stderr,
                     "FAILED: %s did not return within %.0f s (hang, or ncclCommAbort did not return)\n",
                     what_, seconds);
        std::_Exit(3);
      }
    });
  }
  ~HangGuard() {
    done_ = true;
    thread_.join();
  }

 private:
  const char* what_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

std::unique_ptr<NcclComm> one_rank_comm(const char* label, double timeout_s = 60) {
  ncclUniqueId id{};
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  return std::make_unique<NcclComm>(id, 1, 0, 0, label, std::vector<std::string>{"self"}, timeout_s);
}

// This process's place under mpirun: the visible GPUs, the world size and its rank.
struct RankPlace {
  int gpus = 0, world = 1, rank = 0;
};
RankPlace rank_place() {
  RankPlace p;
  p.gpus = cuda_device_count();
  MPI_Comm_size(MPI_COMM_WORLD, &p.world);
  MPI_Comm_rank(MPI_COMM_WORLD, &p.rank);
  return p;
}
// Why a communicator over every rank cannot form here ("" when it can): no GPU, or more ranks than GPUs
// without one NCCL_HOSTID per rank (the shared-GPU test mode, launch/nccl_hostid.sh).
std::string nccl_world_skip(const RankPlace& p) {
  if (p.gpus == 0) return "no CUDA device (cudaGetDeviceCount reports 0): GPU test skipped";
  if (p.world > p.gpus && !std::getenv("NCCL_HOSTID"))
    return std::to_string(p.world) + " ranks on " + std::to_string(p.gpus) +
           " GPU(s): NCCL refuses two ranks on one GPU unless each has its own NCCL_HOSTID (launch/nccl_hostid.sh)";
  return "";
}

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports 0): GPU test skipped";
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world > 1) GTEST_SKIP() << "NCCL comm tests run on one rank (NCCL refuses two ranks on one GPU)";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
  // n floats of `host` in fresh device memory.
  float* upload(const std::vector<float>& host) {
    float* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, host.size() * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    // A pageable cudaMemcpy may return before its DMA lands, and the tests write and reduce on non-blocking
    // streams that do not wait for the legacy one: the old bytes could land over the new.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    allocs_.push_back(d);
    return d;
  }
  std::vector<float> download(const float* d, size_t n) {
    std::vector<float> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void TearDown() override {
    for (float* p : allocs_) cudaFree(p);
  }
  std::vector<float*> allocs_;
};

}  // namespace

TEST_F(NcclTest, AllReduceOfOneRankIsTheIdentityAndOrdersAgainstTheCallersStream) {
  std::unique_ptr<NcclComm> comm = one_rank_comm("test");
  ASSERT_EQ(comm->size(), 1);
  ASSERT_EQ(comm->rank(), 0);
  for (size_t n : {size_t(1), size_t(7), size_t(1000003)}) {
    const std::vector<float> want = pattern(n);
    // Written on the caller's stream, reduced on the comm's, read back on the caller's: without wait_for and
    // record the all-reduce could read the buffer before the copy lands, or the copy back run before it ends.
    cudaStream_t s;
    cudaEvent_t written;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    float* d = upload(std::vector<float>(n, -7.0f));
    std::vector<float> got(n, 0.0f);
    CUDA_OK(cudaMemcpyAsync(d, want.data(), n * sizeof(float), cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaEventRecord(written, s));
    comm->wait_for(written);
    comm->all_reduce_sum(d, n, "test all-reduce");
    CUDA_OK(cudaStreamWaitEvent(s, comm->record(), 0));
    CUDA_OK(cudaMemcpyAsync(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    comm->synchronize("test all-reduce");
    EXPECT_EQ(first_difference(got, want), "") << "1-rank all-reduce of n = " << n;
    cudaEventDestroy(written);
    cudaStreamDestroy(s);
  }
}

TEST_F(NcclTest, SendToSelfInOneGroupCopiesTheBytes) {
  std::unique_ptr<NcclComm> comm = one_rank_comm("test");
  const std::vector<float> want = pattern(12345);  // 49380 bytes: not a multiple of NCCL's chunk sizes
  float* src = upload(want);
  float* dst = upload(std::vector<float>(want.size(), 0.0f));
  comm->p2p({{true, src, want.size() * sizeof(float), 0}, {false, dst, want.size() * sizeof(float), 0}},
            "self send/receive");
  comm->synchronize("self send/receive");
  EXPECT_EQ(first_difference(download(dst, want.size()), want), "");
}

TEST_F(NcclTest, WarmUpChecksItsOwnAllReduceAndSelfRound) {
  std::unique_ptr<NcclComm> comm = one_rank_comm("test");
  comm->warm_up({});
  comm->warm_up({0});  // a send/receive round with itself
}

TEST_F(NcclTest, RankThatNeverJoinsTimesOutWithANamedErrorAndAborts) {
  // A 2-rank communicator whose rank 1 never comes: set-up cannot finish. It must end in df::Error at the
  // bound (2 s), with ncclCommAbort returning, not hang.
  ncclUniqueId id{};
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  HangGuard guard("set-up of a 2-rank comm with one rank missing", 90);
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    NcclComm comm(id, 2, 0, 0, "lonely", {"rank zero", "rank one"}, 2.0);
    FAIL() << "a 2-rank communicator was set up with one rank";
  } catch (const Error& e) {
    msg = e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("missing rank: df::Error after %.2f s: %s\n", s, msg.c_str());
  EXPECT_NE(msg.find("communicator set-up"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lonely communicator at start-up"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank zero, rank 0 of 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not finished after"), std::string::npos) << "expected the timeout path: " << msg;
  EXPECT_GE(s, 2.0) << "gave up before the bound";
  EXPECT_LT(s, 60.0) << "the bound was 2 s; abort took the rest";
}

TEST_F(NcclTest, ReceiveWithoutSendEndsInANamedErrorWithinTheBound) {
  // NCCL requires a receive from self to have its send in the same group. Without one, NCCL either refuses
  // the group (an error at once) or waits forever on the device (the timeout path): either way the rank must
  // get a df::Error naming the operation and the step, within the bound, and not hang.
  std::unique_ptr<NcclComm> comm = one_rank_comm("test", 60);
  comm->set_step(7, 2.0);
  float* dst = upload(std::vector<float>(256, 0.0f));
  HangGuard guard("an unmatched receive and its abort", 90);
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    comm->p2p({{false, dst, 256 * sizeof(float), 0}}, "unmatched receive");
    comm->synchronize("unmatched receive");
    FAIL() << "a receive from self without a send completed";
  } catch (const Error& e) {
    msg = e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("unmatched receive: df::Error after %.2f s (%s path): %s\n", s,
              msg.find("not finished after") != std::string::npos ? "timeout" : "NCCL error", msg.c_str());
  EXPECT_NE(msg.find("unmatched receive"), std::string::npos) << msg;
  EXPECT_NE(msg.find("in step 7"), std::string::npos) << msg;
  EXPECT_LT(s, 60.0) << "the bound was 2 s";
  // The comm is aborted: a further call must refuse, not touch freed NCCL state.
  EXPECT_THROW(comm->all_reduce_sum(dst, 1, "after abort"), Error);
}

TEST(NcclReducerTest, NcclReducerSumsDeviceGradientsInPlace) {
  // One rank: the identity. Under mpirun -np N with N GPUs (test_nccl_reducers.sh on a multi-GPU machine):
  // rank r on GPU r, every element times N, exact for the pattern's values.
  const RankPlace at = rank_place();
  if (const std::string why = nccl_world_skip(at); !why.empty()) GTEST_SKIP() << why;
  const int gpus = at.gpus, world = at.world, rank = at.rank;
  ASSERT_EQ(cudaSetDevice(rank % gpus), cudaSuccess);
  std::unique_ptr<NcclComm> comm = NcclComm::create(MPI_COMM_WORLD, rank % gpus, "drafters", {}, 60);
  comm->warm_up({});
  cudaStream_t compute;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  std::unique_ptr<GradReducer> r = grad_reducer_nccl(*comm, compute, MPI_COMM_WORLD);
  EXPECT_EQ(r->size(), world);
  EXPECT_EQ(r->rank(), rank);
  const std::vector<float> want = pattern(333333);
  float* d = nullptr;
  CUDA_OK(cudaMalloc(&d, want.size() * sizeof(float)));
  // Queued on the compute stream and not waited for: the reducer must order itself after it.
  CUDA_OK(cudaMemcpyAsync(d, want.data(), want.size() * sizeof(float), cudaMemcpyHostToDevice, compute));
  r->sum(d, want.size());
  std::vector<float> got(want.size());
  CUDA_OK(cudaMemcpyAsync(got.data(), d, got.size() * sizeof(float), cudaMemcpyDeviceToHost, compute));
  CUDA_OK(cudaStreamSynchronize(compute));
  EXPECT_EQ(first_difference(got, want, float(world)), "") << "NCCL reducer over " << world << " rank(s)";
  std::vector<double> stats = {1.5, -2.0, 3e10};
  r->sum(stats.data(), stats.size());
  EXPECT_EQ(stats, (std::vector<double>{1.5 * world, -2.0 * world, 3e10 * world}))
      << "host statistics over MPI";
  cudaFree(d);
  cudaStreamDestroy(compute);
}

TEST(NcclReducerTest, StagedReducerSumsDeviceGradientsOverMpi) {
  // One rank: the identity (nothing staged). Under mpirun -np 2 (test_nccl_reducers.sh): every element
  // doubled, exact since the pattern's values and their doubles are exact in fp32.
  if (cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports 0): GPU test skipped";
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ASSERT_EQ(cudaSetDevice(rank % cuda_device_count()), cudaSuccess);
  cudaStream_t compute;
  CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  const std::vector<float> want = pattern(1000003);
  std::unique_ptr<GradReducer> r = grad_reducer_staged(MPI_COMM_WORLD, compute, want.size() + 5);
  EXPECT_EQ(r->size(), world);
  float* d = nullptr;
  CUDA_OK(cudaMalloc(&d, want.size() * sizeof(float)));
  for (int round = 0; round < 2; ++round) {  // the second reuses the pinned buffer
    CUDA_OK(cudaMemcpyAsync(d, want.data(), want.size() * sizeof(float), cudaMemcpyHostToDevice, compute));
    r->sum(d, want.size());
    std::vector<float> got(want.size());
    CUDA_OK(cudaMemcpyAsync(got.data(), d, got.size() * sizeof(float), cudaMemcpyDeviceToHost, compute));
    CUDA_OK(cudaStreamSynchronize(compute));
    EXPECT_EQ(first_difference(got, want, float(world)), "")
        << "staged reducer over " << world << " ranks, round " << round;
  }
  EXPECT_THROW(r->sum(d, want.size() + 6), Error)
      << "more floats than the staging buffer holds must be refused";
  cudaFree(d);
  cudaStreamDestroy(compute);
}
TEST(NcclWorldTest, RingOf64MiBArrivesByteForByteAndAllReduceSums) {
  // The mechanism itself, under mpirun -np N (test_nccl_reducers.sh): every rank sends 64 MiB to the next
  // and receives from the previous in one group, then all-reduces 16 Mi floats. Every byte is checked. The
  // time is printed with the bytes, as a correctness run: with ranks sharing a GPU it is NCCL's socket path
  // on loopback, never an interconnect figure.
  const RankPlace at = rank_place();
  if (const std::string why = nccl_world_skip(at); !why.empty()) GTEST_SKIP() << why;
  if (at.world < 2) GTEST_SKIP() << "needs mpirun -np 2 or more (tests/gpu/test_nccl_reducers.sh runs it so)";
  const int gpus = at.gpus, world = at.world, rank = at.rank;
  ASSERT_EQ(cudaSetDevice(rank % gpus), cudaSuccess);
  std::unique_ptr<NcclComm> comm = NcclComm::create(MPI_COMM_WORLD, rank % gpus, "world", {}, 120);
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  comm->warm_up({next, prev});
  constexpr size_t kBytes = size_t(64) << 20;
  // Byte i of rank r's payload: (i * 7 + 13 * r + i / 4093) mod 256, so a shifted or swapped page shows.
  auto byte_of = [](size_t i, int r) { return uint8_t(i * 7 + size_t(13 * r) + i / 4093); };
  std::vector<uint8_t> host(kBytes);
  for (size_t i = 0; i < kBytes; ++i) host[i] = byte_of(i, rank);
  uint8_t *src = nullptr, *dst = nullptr;
  CUDA_OK(cudaMalloc(&src, kBytes));
  CUDA_OK(cudaMalloc(&dst, kBytes));
  CUDA_OK(cudaMemcpy(src, host.data(), kBytes, cudaMemcpyHostToDevice));
  double best_s = 1e30, sum_s = 0;
  constexpr int kRuns = 3;
  for (int run = 0; run <= kRuns; ++run) {  // run 0 is the warm-up
    CUDA_OK(cudaMemset(dst, 0, kBytes));
    CUDA_OK(cudaDeviceSynchronize());
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    comm->p2p({{true, src, kBytes, next}, {false, dst, kBytes, prev}}, "64 MiB ring send/receive");
    comm->synchronize("64 MiB ring send/receive");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (run > 0) {
      best_s = std::min(best_s, s);
      sum_s += s;
    }
    CUDA_OK(cudaMemcpy(host.data(), dst, kBytes, cudaMemcpyDeviceToHost));
    size_t bad = 0, first = kBytes;
    for (size_t i = 0; i < kBytes; ++i)
      if (host[i] != byte_of(i, prev) && bad++ == 0) first = i;
    ASSERT_EQ(bad, size_t(0)) << "run " << run << ": " << bad << " of " << kBytes << " bytes from rank " << prev
                              << " differ, the first at " << first;
  }
  std::printf("rank %d of %d: 64 MiB ring send/receive: %zu bytes each way, best %.1f ms, mean %.1f ms = %.3f GB/s "
              "(correctness run%s)\n",
              rank, world, kBytes, best_s * 1e3, sum_s / kRuns * 1e3, double(kBytes) / best_s / 1e9,
              world > gpus ? ": ranks share a GPU, NCCL's socket transport on loopback, not an interconnect figure"
                           : "");
  const size_t n = size_t(16) << 20;
  const std::vector<float> want = pattern(n);
  float* d = nullptr;
  CUDA_OK(cudaMalloc(&d, n * sizeof(float)));
  CUDA_OK(cudaMemcpy(d, want.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());  // the pageable copy's DMA, before the communicator's stream reads d
  const auto t0 = std::chrono::steady_clock::now();
  comm->all_reduce_sum(d, n, "16 Mi-float all-reduce");
  comm->synchronize("16 Mi-float all-reduce");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<float> got(n);
  CUDA_OK(cudaMemcpy(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  // Every addend is the same pattern value, exact in fp32 with its N-fold sum, so any order gives N·x.
  EXPECT_EQ(first_difference(got, want, float(world)), "") << "all-reduce over " << world << " ranks";
  std::printf("rank %d of %d: all-reduce of %zu floats (%zu bytes): %.1f ms\n", rank, world, n, n * sizeof(float),
              s * 1e3);
  cudaFree(d);
  cudaFree(src);
  cudaFree(dst);
}
#endif
