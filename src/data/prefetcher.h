// The prefetch stage: a thread that materialises the batches one target computes (token ids, loss mask,
// offsets) into the bounded queue q_pre, so HDF5 reads overlap the target's forward pass. A failure in
// the thread reaches the consumer as the same exception on its next pop.
#pragma once
#include <atomic>
#include <cstdint>
#include <optional>
#include <thread>
#include <vector>

#include "core/bounded_queue.h"
#include "data/batcher.h"
#include "data/token_file.h"

namespace df {

struct MaterialisedBatch {
  int64_t global_index = 0;
  int64_t epoch = 0;
  std::vector<int64_t> sequence_ids;  // corpus sequence of each packed sequence
  std::vector<int64_t> offsets;       // S+1, offsets[0] == 0, offsets[S] == tokens.size()
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;     // one 0/1 per token
};

// Reads a batch's items from the corpus into one packed buffer.
MaterialisedBatch batch_materialise(const TokenCorpus& corpus, const Batch& batch);

class Prefetcher {
 public:
  // Starts the thread at once. `corpus` and `batcher` must outlive the prefetcher.
  Prefetcher(const TokenCorpus& corpus, const Batcher& batcher, std::vector<int64_t> batch_indices,
             size_t capacity);
  ~Prefetcher();  // stops the thread (even if blocked on a full queue) and joins it
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Next batch in the order of `batch_indices`; nullopt after the last. Rethrows a failure of the thread.
  std::optional<MaterialisedBatch> next() { return queue_.pop(); }
  size_t depth() const { return queue_.size(); }  // for the q_pre metric
  size_t capacity() const { return queue_.capacity(); }

 private:
  void run();

  const TokenCorpus& corpus_;
  const Batcher& batcher_;
  const std::vector<int64_t> indices_;
  BoundedQueue<MaterialisedBatch> queue_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace df
