// BoundedQueue and the prefetch thread: FIFO order, blocking and wake-up, clean shutdown with a full
// queue, materialised contents, and a failure in the thread surfacing in the consumer.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/bounded_queue.h"
#include "core/error.h"
#include "data/prefetcher.h"
#include "data/synth.h"
#include "test_data_util.h"

using namespace df;
using df_test::ScratchDir;
using namespace std::chrono_literals;

namespace {

// Polls `cond` for up to 5 s: long enough for a loaded CI machine, short enough to fail a hang quickly.
template <class F>
bool eventually(F cond) {
  auto until = std::chrono::steady_clock::now() + 5s;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

struct SynthCorpus {
  ScratchDir dir;
  TokenData data;
  std::unique_ptr<TokenCorpus> corpus;
  std::unique_ptr<Batcher> batcher;
  SynthCorpus() {
    data = synth_generate({.vocab_size = 97, .sequences = 65, .min_len = 3, .max_len = 40, .seed = 9});
    token_file_write(dir.file("s.h5"), data);
    corpus = std::make_unique<TokenCorpus>(std::vector<std::string>{dir.file("s.h5")});
    batcher = std::make_unique<Batcher>(corpus->sequence_lengths(),
                                        BatcherOptions{.seed = 1, .token_budget = 64, .bucket_bounds = {8, 19}});
  }
};

}  // namespace

TEST(BoundedQueue, FifoCloseAndFail) {
  BoundedQueue<int> q(3);
  EXPECT_TRUE(q.push(1));
  EXPECT_TRUE(q.push(2));
  EXPECT_EQ(q.size(), 2u);
  EXPECT_EQ(*q.pop(), 1);
  q.close();
  EXPECT_FALSE(q.push(3));
  EXPECT_EQ(*q.pop(), 2);  // closing keeps what was queued
  EXPECT_FALSE(q.pop().has_value());
  BoundedQueue<int> f(1);
  f.push(1);
  f.fail(std::make_exception_ptr(Error("boom")));
  EXPECT_THROW(f.pop(), Error);
  EXPECT_THROW(f.try_pop(), Error);
  EXPECT_THROW(BoundedQueue<int>(0), Error);
}

TEST(BoundedQueue, FullQueueBlocksUntilPopOrClose) {
  BoundedQueue<int> q(1);
  q.push(0);
  std::atomic<int> pushed{0};
  std::thread producer([&] {
    pushed += q.push(1);
    pushed += q.push(2);  // blocks until close, then gives up
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(pushed.load(), 0);
  EXPECT_EQ(*q.pop(), 0);
  EXPECT_TRUE(eventually([&] { return pushed.load() == 1; }));
  q.close();
  producer.join();
  EXPECT_EQ(pushed.load(), 1);
  EXPECT_EQ(*q.try_pop(), 1);  // the item pushed before close is still there
}

TEST(Prefetcher, DeliversRequestedBatchesInOrder) {
  SynthCorpus s;
  std::vector<int64_t> wanted = {5, 0, 3, 19, 7, s.batcher->epoch_start(1) + 2};
  Prefetcher p(*s.corpus, *s.batcher, wanted, 2);
  EXPECT_EQ(p.capacity(), 2u);
  for (int64_t g : wanted) {
    std::optional<MaterialisedBatch> b = p.next();
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->global_index, g);
    Batch plan = s.batcher->batch_at(g);
    EXPECT_EQ(b->epoch, plan.epoch);
    ASSERT_EQ(b->sequence_ids.size(), plan.items.size());
    ASSERT_EQ(b->offsets.size(), plan.items.size() + 1);
    EXPECT_EQ(b->offsets.back(), static_cast<int64_t>(b->tokens.size()));
    EXPECT_EQ(b->loss_mask.size(), b->tokens.size());
    for (size_t i = 0; i < plan.items.size(); ++i) {
      int64_t seq = plan.items[i].seq, src = s.data.offsets[seq];
      EXPECT_EQ(b->sequence_ids[i], seq);
      for (int64_t k = 0; k < plan.items[i].length; ++k) {
        EXPECT_EQ(b->tokens[b->offsets[i] + k], s.data.tokens[src + k]);
        EXPECT_EQ(b->loss_mask[b->offsets[i] + k], s.data.loss_mask[src + k]);
      }
    }
  }
  EXPECT_FALSE(p.next().has_value());
  EXPECT_FALSE(p.next().has_value());
}

TEST(Prefetcher, FillsToCapacityAndShutsDownWhileBlocked) {
  SynthCorpus s;
  auto start = std::chrono::steady_clock::now();
  {
    Prefetcher p(*s.corpus, *s.batcher, batch_indices_for_target(0, 1000, 1, 3), 3);
    EXPECT_TRUE(eventually([&] { return p.depth() == 3; }));
    ASSERT_TRUE(p.next().has_value());
    EXPECT_TRUE(eventually([&] { return p.depth() == 3; }));
  }  // the thread is blocked on a full queue here; the destructor must wake and join it
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(Prefetcher, ThreadFailureReachesConsumer) {
  SynthCorpus s;
  // Index -1 makes batch_at throw inside the prefetch thread.
  Prefetcher p(*s.corpus, *s.batcher, {0, -1, 1}, 4);
  try {
    for (int i = 0; i < 3; ++i) p.next();
    ADD_FAILURE() << "the prefetch error was swallowed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch index -1"), std::string::npos) << e.what();
  }
}

TEST(Prefetcher, BadTokenInFileNamesFileAndSequence) {
  ScratchDir dir;
  TokenData d;
  d.vocab_size = 10;
  d.tokens = {1, 2, 3, 4};
  d.offsets = {0, 2, 4};
  std::string path = dir.file("v.h5");
  token_file_write(path, d);
  // Corrupt sequence 1 behind the writer's back (an id past the recorded vocabulary).
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t t = H5Dopen2(f, "tokens", H5P_DEFAULT);
  int32_t bad[4] = {1, 2, 3, 10};
  H5Dwrite(t, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, bad);
  H5Dclose(t);
  H5Fclose(f);
  TokenCorpus corpus({path});
  Batcher batcher(corpus.sequence_lengths(), BatcherOptions{.seed = 0, .token_budget = 2, .bucket_bounds = {}});
  Prefetcher p(corpus, batcher, {0, 1}, 2);
  try {
    p.next();
    p.next();
    ADD_FAILURE() << "out-of-vocabulary token not detected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("v.h5 sequence 1"), std::string::npos) << e.what();
  }
}
