// The NCCL payload wire of the feature channel (comm/feature_channel_nccl.h) on one GPU: a send to self and
// its receive in one NCCL group (NCCL refuses two ranks on one GPU, and a self send needs its receive in the
// same group), between the device slots of two pools whose compute streams belong to two CudaOps, as a
// target's and a drafter's would. The bytes must arrive exactly (a copy, no arithmetic), ordered by events
// both ways; a transfer with no partner must end in a df::Error naming the batch, the peer and the step
// within the bound, not hang. The end-to-end run over two GPUs is tests/gpu/test_train_nccl_features.sh.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(FeatureNccl, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA/NCCL: NCCL wire tests skipped";
}
#else
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "comm/feature_channel_nccl.h"
#include "ops/cuda/cuda_ops.h"
#include "tests/unit/mpi_test_env.h"

namespace df {
namespace {

// An awkward payload: 7777 tokens, 3 taps of 64 plus a final hidden of 64 (4 MB), so the final hidden starts
// on a padded 256-byte boundary and the byte count is no multiple of NCCL's chunks.
constexpr int64_t kTokens = 7777, kFeatCols = 192, kFinalCols = 64;

class FeatureNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0 || mpi_world_size() > 1)
      GTEST_SKIP() << "needs a CUDA device and one rank (NCCL refuses two ranks on one GPU): "
                   << cuda_device_count() << " device(s), " << mpi_world_size() << " rank(s)";
    ncclUniqueId id{};
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    comm_ =
        std::make_unique<NcclComm>(id, 1, 0, 0, "world", std::vector<std::string>{"self (world rank 0)"}, 60);
  }
  std::unique_ptr<NcclComm> comm_;
};

// The first differing byte, as "byte i of n: got a, expected b (k differ)"; empty when equal.
std::string first_difference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && bad++ == 0) first = i;
  if (bad == 0) return "";
  char buf[160];
  std::snprintf(buf, sizeof(buf), "byte %zu of %zu: got 0x%02x, expected 0x%02x (%zu bytes differ)", first,
                want.size(), got[first], want[first], bad);
  return buf;
}

std::vector<uint8_t> slot_bytes(CudaOps& ops, char* slot, size_t n) {
  std::vector<uint8_t> out(n);
  ops.download_raw(tensor_make(slot, DType::u8, Device::cuda, 1, int64_t(n)), out.data());  // on ops' stream
  return out;
}

TEST_F(FeatureNccl, SendToSelfCarriesTheSlotOrderedAgainstBothComputeStreams) {
  CudaOps target(0), drafter(0);  // two compute streams on one GPU
  const size_t n = WireLayout::bytes(kTokens, kFeatCols, kFinalCols);
  std::unique_ptr<WirePool> tx_pool = target.wire_pool(2, n, false), rx_pool = drafter.wire_pool(1, n, false);
  EXPECT_THROW(tx_pool->host(0), Error) << "a pool for the NCCL wire has no host mirrors";
  NcclWire tx(*comm_, *tx_pool), rx(*comm_, *rx_pool);
  const int64_t elems = int64_t(n / 2);
  for (int round = 0; round < 2; ++round) {
    const int slot = round;  // both send slots, the one receive slot twice
    // The "forward": zeros, then 20 random fills queued on the target's stream and not waited for (the last
    // one's values stay); a send that did not wait for them would carry zeros or a mix, and a drafter read
    // that did not wait for the receive would see its slot's old bytes.
    const Tensor src = tensor_make(tx_pool->data(slot), DType::bf16, Device::cuda, 1, elems);
    const std::vector<uint16_t> zeros(size_t(elems), 0);
    target.upload_raw(src, zeros.data());
    for (int f = 0; f < 20; ++f) target.fill_normal(src, 29, uint64_t(round * 100 + f), 0.f, 1.f);
    comm_->set_step(round, 30);
    comm_->p2p({tx.begin(slot, true, n, 0, 10 + round), rx.begin(0, false, n, 0, 10 + round)},
               "self transfer");
    tx.end(slot);
    rx.end(0);
    EXPECT_EQ(rx.what(0), "feature payload recv of batch " + std::to_string(10 + round));
    // Read on the drafter's stream before the host waits: the stream itself must wait for the receive.
    const std::vector<uint8_t> early = slot_bytes(drafter, rx_pool->data(0), n);
    rx.arrived(0);
    const std::vector<uint8_t> want = slot_bytes(target, tx_pool->data(slot), n);
    EXPECT_EQ(first_difference(early, want), "")
        << "round " << round << ": the drafter's stream read the slot "
        << "before the receive landed, or the send left before the fill";
    EXPECT_EQ(first_difference(slot_bytes(drafter, rx_pool->data(0), n), want), "") << "round " << round;
    const auto t0 = std::chrono::steady_clock::now();
    while (!tx.left(slot))
      ASSERT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0)
          << "the send's completion event never fired though the receive landed";
  }
}

// NCCL requires a self send's receive in the same group: alone, it either fails at once or never finishes
// (the timeout path). Either way a df::Error naming the transfer, the peer and the step within the bound (2
// s), not a hang. send: a send nobody receives (the target's wait, left()), else a receive with no send
// (arrived()).
void expect_unmatched_fails(NcclComm& comm, bool send) {
  CudaOps ops(0);
  const size_t n = WireLayout::bytes(kTokens, kFeatCols, kFinalCols);
  std::unique_ptr<WirePool> pool = ops.wire_pool(1, n, false);
  NcclWire wire(comm, *pool);
  comm.set_step(4, 2.0);
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    if (send) {
      wire.post(0, n, 0, 9, nullptr);
      while (!wire.left(0)) {
      }
    } else {
      wire.receive(0, n, 0, 9);
      wire.arrived(0);
    }
  } catch (const Error& e) {
    msg = e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const char* what = send ? "feature payload send of batch 9" : "feature payload recv of batch 9";
  std::printf("unmatched %s: after %.2f s: %s\n", what, s, msg.c_str());
  ASSERT_FALSE(msg.empty()) << what << " to/from self without its partner completed";
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
  EXPECT_NE(msg.find(send ? "send to self (world rank 0)" : "receive from self (world rank 0)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("in step 4"), std::string::npos) << msg;
  EXPECT_LT(s, 60.0) << "the bound was 2 s";
}

TEST_F(FeatureNccl, AReceiveWithoutItsSendEndsInANamedErrorWithinTheBound) {
  expect_unmatched_fails(*comm_, false);
}

TEST_F(FeatureNccl, ASendNobodyReceivesEndsInANamedErrorWithinTheBound) {
  expect_unmatched_fails(*comm_, true);
}

}  // namespace
}  // namespace df
#endif
