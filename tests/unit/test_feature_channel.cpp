// The feature channel's protocol (comm/feature_channel.h) on host pools: which targets feed a drafter, and,
// under mpirun (tests/mpi/test_feature_channel.sh), targets streaming batches to drafters that stop early and
// drain the rest in batch order: every batch a drafter takes must carry its own bytes, and the drain must end
// (a hang is the failure the NCCL wire would turn the wrong drain order into). One rank: the MPI cases skip.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "comm/feature_channel.h"
#include "tests/unit/mpi_test_env.h"

namespace df {
namespace {

TEST(FeatureSources, ATargetFeedsTheDraftersCongruentModTheGcd) {
  // 2 targets, 2 drafters: batch b goes from target b % 2 to drafter b % 2, so each pair is fixed.
  EXPECT_EQ(feature_sources(2, 2, 0), (std::vector<bool>{true, false}));
  EXPECT_EQ(feature_sources(2, 2, 1), (std::vector<bool>{false, true}));
  // 2 targets, 3 drafters (coprime): every target feeds every drafter (b = 3 from target 1 to drafter 0).
  EXPECT_EQ(feature_sources(2, 3, 0), (std::vector<bool>{true, true}));
  // 4 targets, 6 drafters: gcd 2; drafter 3 hears from the odd targets only.
  EXPECT_EQ(feature_sources(4, 6, 3), (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(feature_sources(1, 5, 4), (std::vector<bool>{true}));
  EXPECT_THROW(feature_sources(2, 2, 2), Error);
}

// Batch b's shape and bytes: both ends compute them, so a payload in the wrong slot or order shows.
int64_t tokens_of(int64_t b) {
  return 3 + b % 5;
}
constexpr int64_t kFeatCols = 4, kFinalCols = 2;
char byte_of(int64_t b, size_t i) {
  return char((b * 131 + int64_t(i) * 7) & 0xff);
}

// Targets are world ranks [0, T), drafters the rest; targets have batches [0, batches); each drafter takes
// `takes` of its batches off the channel, then drains.
void stream(int T, int64_t batches, int takes) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int D = world - T;
  std::vector<int> targets, drafters;
  for (int r = 0; r < world; ++r) (r < T ? targets : drafters).push_back(r);
  const size_t slot_bytes = WireLayout::bytes(tokens_of(4), kFeatCols, kFinalCols);
  if (rank < T) {
    std::unique_ptr<WirePool> pool = wire_pool_host(2, slot_bytes);
    std::unique_ptr<FeatureSender> tx = feature_sender_mpi(MPI_COMM_WORLD, drafters, 2, *pool);
    for (int64_t b = rank; b < batches && !tx->stopped(); b += T) {
      char* slot = tx->acquire();
      FeaturePacket p;
      p.hdr.batch_id = b;
      p.hdr.num_seqs = 1;
      p.hdr.tokens = tokens_of(b);
      p.hdr.feat_cols = kFeatCols;
      p.hdr.final_cols = kFinalCols;
      p.offsets = {0, p.hdr.tokens};
      p.tokens.assign(size_t(p.hdr.tokens), int32_t(b));
      p.loss_mask.assign(size_t(p.hdr.tokens), 1);
      const size_t n = WireLayout::bytes(p.hdr.tokens, kFeatCols, kFinalCols);
      for (size_t i = 0; i < n; ++i) slot[i] = byte_of(b, i);
      if (!tx->send(int(b % D), std::move(p))) break;
    }
    tx->finish();
  } else {
    const int d = rank - T;
    std::unique_ptr<WirePool> pool = wire_pool_host(1, slot_bytes);
    std::unique_ptr<FeatureReceiver> rx = feature_receiver_mpi(MPI_COMM_WORLD, targets, {d, D}, *pool);
    for (int k = 0; k < takes; ++k) {
      const int64_t b = d + int64_t(k) * D;
      const FeaturePacket p = rx->recv(int(b % T));
      ASSERT_EQ(p.hdr.batch_id, b) << "drafter " << d << ", its batch " << k;
      ASSERT_EQ(p.hdr.tokens, tokens_of(b));
      ASSERT_EQ(p.tokens, std::vector<int32_t>(size_t(tokens_of(b)), int32_t(b)));
      ASSERT_NE(p.slot, nullptr);
      const size_t n = WireLayout::bytes(p.hdr.tokens, kFeatCols, kFinalCols);
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(p.slot[i], byte_of(b, i)) << "batch " << b << " payload byte " << i << " of " << n;
    }
    rx->finish();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Under mpirun with DF_TEST_TARGETS=T: T targets, the other ranks drafters. Skips in a singleton.
class FeatureChannelMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_size(MPI_COMM_WORLD, &world_);
    const char* e = std::getenv("DF_TEST_TARGETS");
    targets_ = e ? std::atoi(e) : 0;
    if (targets_ < 1 || targets_ >= world_)
      GTEST_SKIP() << "needs mpirun with DF_TEST_TARGETS in [1, ranks) (tests/mpi/test_feature_channel.sh)";
  }
  int world_ = 1, targets_ = 0;
};

TEST_F(FeatureChannelMpi, DraftersThatStopEarlyDrainEveryTargetInBatchOrder) {
  // 40 batches and 2 credits per drafter: most are still coming when the drafters stop after 3 each.
  stream(targets_, 40, 3);
}

TEST_F(FeatureChannelMpi, DraftersThatTakeNothingStillDrain) {
  stream(targets_, 40, 0);
}

TEST_F(FeatureChannelMpi, DraftersThatTakeEveryBatchSeeEveryTargetEnd) {
  // 12 batches over D drafters: each takes exactly its share, then sees only ENDs.
  const int D = world_ - targets_;
  if (12 % D != 0) GTEST_SKIP() << "12 batches do not split evenly over " << D << " drafters";
  stream(targets_, 12, 12 / D);
}

}  // namespace
}  // namespace df
