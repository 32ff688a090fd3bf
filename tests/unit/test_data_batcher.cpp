// Batcher: determinism from the seed, a new batch composition every epoch, the token budget, bucketing,
// every sequence exactly once per epoch, random access for resume, and the routing helper.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "data/batcher.h"
#include "core/rng.h"

using namespace df;

namespace {

// 733 sequences with lengths 0..300 (a few empty, a few over the budget of 256).
std::vector<int64_t> make_lengths(int64_t n = 733) {
  Rng rng(17);
  std::vector<int64_t> lens(static_cast<size_t>(n));
  for (auto& l : lens) l = rng.range(0, 300);
  for (size_t i = 5; i < lens.size(); i += 97) lens[i] = 0;  // empty sequences, whatever the draws gave
  return lens;
}

BatcherOptions make_options(uint64_t seed = 5) {
  BatcherOptions o;
  o.seed = seed;
  o.token_budget = 256;
  o.bucket_bounds = {16, 64, 128};
  return o;
}

std::vector<Batch> epoch_batches(const Batcher& b, int64_t epoch) {
  std::vector<Batch> out;
  int64_t start = b.epoch_start(epoch);
  for (int64_t i = 0; i < b.batches_in_epoch(epoch); ++i) out.push_back(b.batch_at(start + i));
  return out;
}

// Batch compositions as sets of sequence ids, order-free.
std::set<std::vector<int64_t>> compositions(const std::vector<Batch>& batches) {
  std::set<std::vector<int64_t>> out;
  for (const Batch& b : batches) {
    std::vector<int64_t> ids;
    for (const BatchItem& it : b.items) ids.push_back(it.seq);
    std::sort(ids.begin(), ids.end());
    out.insert(ids);
  }
  return out;
}

size_t bucket_of(int64_t len, const std::vector<int64_t>& bounds) {
  return static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), len) - bounds.begin());
}

}  // namespace

TEST(Batcher, EverySequenceOnceWithinBudgetAndBucket) {
  std::vector<int64_t> lens = make_lengths();
  Batcher b(lens, make_options());
  int64_t empty = std::count(lens.begin(), lens.end(), 0);
  int64_t too_long = std::count_if(lens.begin(), lens.end(), [](int64_t l) { return l > 256; });
  ASSERT_GT(empty, 0);
  ASSERT_GT(too_long, 0);
  EXPECT_EQ(b.num_empty(), empty);
  EXPECT_EQ(b.num_truncated(), too_long);
  for (int64_t epoch : {0, 1, 2}) {
    std::map<int64_t, int> seen;
    for (const Batch& batch : epoch_batches(b, epoch)) {
      EXPECT_EQ(batch.epoch, epoch);
      ASSERT_FALSE(batch.items.empty());
      EXPECT_LE(batch.num_tokens(), 256);
      size_t bucket = bucket_of(batch.items[0].length, b.options().bucket_bounds);
      for (const BatchItem& it : batch.items) {
        ++seen[it.seq];
        EXPECT_EQ(it.start, 0);
        EXPECT_EQ(it.length, std::min<int64_t>(lens[it.seq], 256));
        EXPECT_EQ(bucket_of(it.length, b.options().bucket_bounds), bucket) << "batch mixes buckets";
      }
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), static_cast<int64_t>(lens.size()) - empty);
    for (const auto& [seq, count] : seen) {
      EXPECT_EQ(count, 1) << "sequence " << seq << " in epoch " << epoch;
      EXPECT_GT(lens[seq], 0);
    }
  }
}

TEST(Batcher, SameSeedSameBatchesOtherSeedOthers) {
  std::vector<int64_t> lens = make_lengths();
  Batcher a(lens, make_options(5)), b(lens, make_options(5)), c(lens, make_options(6));
  int64_t n = a.epoch_start(2);
  bool differs = false;
  for (int64_t g = 0; g < n; ++g) {
    Batch x = a.batch_at(g), y = b.batch_at(g), z = c.batch_at(g);
    EXPECT_EQ(x.items, y.items);
    EXPECT_EQ(x.epoch, y.epoch);
    differs = differs || x.items != z.items;
  }
  EXPECT_TRUE(differs);
}

TEST(Batcher, EachEpochComposesDifferentBatches) {
  Batcher b(make_lengths(), make_options());
  auto e0 = compositions(epoch_batches(b, 0)), e1 = compositions(epoch_batches(b, 1));
  // Batches holding one sequence (those over half the budget) recur by necessity; judge the packed ones.
  int64_t packed = 0, repeated = 0;
  for (const auto& c : e0) {
    if (c.size() < 2) continue;
    ++packed;
    repeated += e1.count(c);
  }
  ASSERT_GT(packed, 50);
  EXPECT_LT(repeated, packed / 10) << repeated << " of " << packed << " packed batches repeat in epoch 1";
}

TEST(Batcher, RandomAccessMatchesSequentialForResume) {
  std::vector<int64_t> lens = make_lengths();
  Batcher seq(lens, make_options());
  int64_t n = seq.epoch_start(3);
  std::vector<Batch> forward;
  for (int64_t g = 0; g < n; ++g) forward.push_back(seq.batch_at(g));
  // A resumed run starts with a fresh batcher at an arbitrary cursor, jumping between epochs.
  Batcher resumed(lens, make_options());
  for (int64_t g : {n - 1, int64_t{0}, n / 2, int64_t{1}, n - 2, n / 3}) {
    Batch b = resumed.batch_at(g);
    EXPECT_EQ(b.items, forward[g].items) << "batch " << g;
    EXPECT_EQ(b.epoch, forward[g].epoch);
    EXPECT_EQ(b.global_index, g);
    EXPECT_EQ(resumed.epoch_start(b.epoch) + b.index_in_epoch, g);
  }
}

TEST(Batcher, FingerprintChangesWithCorpusOrOptions) {
  std::vector<int64_t> lens = make_lengths();
  uint64_t base = Batcher(lens, make_options()).fingerprint();
  EXPECT_EQ(Batcher(lens, make_options()).fingerprint(), base);
  EXPECT_NE(Batcher(lens, make_options(6)).fingerprint(), base);
  BatcherOptions o = make_options();
  o.bucket_bounds = {16, 64, 129};
  EXPECT_NE(Batcher(lens, o).fingerprint(), base);
  lens[3] += 1;
  EXPECT_NE(Batcher(lens, make_options()).fingerprint(), base);
}

TEST(Batcher, AwkwardCorpora) {
  // One sequence: one batch per epoch, truncated to the budget.
  Batcher one({1000}, make_options());
  EXPECT_EQ(one.batches_in_epoch(0), 1);
  EXPECT_EQ(one.batch_at(7).epoch, 7);
  EXPECT_EQ(one.batch_at(7).items[0].length, 256);
  // No buckets at all: everything in one bucket; 19 sequences of 7 tokens fill 36 per batch (252 tokens).
  BatcherOptions o = make_options();
  o.bucket_bounds.clear();
  Batcher flat(std::vector<int64_t>(19 * 3, 7), o);
  EXPECT_EQ(flat.batches_in_epoch(0), 2);
  EXPECT_EQ(flat.batch_at(0).num_tokens() + flat.batch_at(1).num_tokens(), 19 * 3 * 7);
}

TEST(Batcher, RejectsBadOptions) {
  BatcherOptions o = make_options();
  o.token_budget = 0;
  EXPECT_THROW(Batcher({3}, o), Error);
  o = make_options();
  o.bucket_bounds = {64, 16};
  EXPECT_THROW(Batcher({3}, o), Error);
  EXPECT_THROW(Batcher({0, 0}, make_options()), Error);
  Batcher b({3}, make_options());
  EXPECT_THROW(b.batch_at(-1), Error);
}

TEST(BatchRouting, TargetsPartitionTheGlobalOrder) {
  for (int T : {1, 3, 7}) {
    std::vector<int> owner(65, -1);
    for (int t = 0; t < T; ++t) {
      for (int64_t g : batch_indices_for_target(19, 84, t, T)) {
        EXPECT_EQ(batch_target(g, T), t);
        EXPECT_EQ(owner[g - 19], -1);
        owner[g - 19] = t;
      }
    }
    EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
  }
  EXPECT_THROW(batch_indices_for_target(0, 10, 3, 3), Error);
}
