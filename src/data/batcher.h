// Turns a corpus into an endless, deterministic sequence of token-budget batches. Per epoch: sequences are
// length-bucketed, shuffled inside each bucket with a seed of (seed, epoch, bucket), packed greedily up to
// `token_budget` tokens, and the batches of all buckets are put in one order seeded by (seed, epoch).
// batch_at(g) depends only on the options and g, so a checkpoint stores just the global batch cursor.
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

namespace df {

struct BatcherOptions {
  uint64_t seed = 0;
  int64_t token_budget = 0;            // most tokens in one batch; longer sequences are cut to it
  std::vector<int64_t> bucket_bounds;  // ascending: bucket i holds lengths in (b[i-1], b[i]], one more above
};

// Tokens [start, start+length) of corpus sequence `seq`.
struct BatchItem {
  int64_t seq = 0;
  int64_t start = 0;
  int64_t length = 0;
  bool operator==(const BatchItem&) const = default;
};

struct Batch {
  int64_t global_index = 0;
  int64_t epoch = 0;
  int64_t index_in_epoch = 0;
  std::vector<BatchItem> items;
  int64_t num_tokens() const;
};

class Batcher {
 public:
  // Empty sequences are left out (they hold nothing to train on); at least one must be non-empty.
  Batcher(std::vector<int64_t> sequence_lengths, BatcherOptions options);

  Batch batch_at(int64_t global_index) const;
  int64_t batches_in_epoch(int64_t epoch) const;
  int64_t epoch_start(int64_t epoch) const;  // global index of the epoch's first batch
  int64_t num_truncated() const { return num_truncated_; }
  int64_t num_empty() const { return num_empty_; }
  size_t num_buckets() const { return buckets_.size(); }
  const BatcherOptions& options() const { return options_; }

 private:
  struct EpochPlan {
    int64_t epoch = -1;
    std::vector<BatchItem> items;     // all batches of the epoch, back to back in global order
    std::vector<int64_t> batch_begin; // batch i is items[batch_begin[i], batch_begin[i+1])
  };
  EpochPlan plan_epoch(int64_t epoch) const;
  // Extends epoch_starts_ until it covers `epoch`; mu_ held.
  void extend_epoch_starts_locked(int64_t epoch) const;

  BatcherOptions options_;
  std::vector<int64_t> lengths_;                // after truncation to the budget
  std::vector<std::vector<int64_t>> buckets_;   // sequence ids per bucket, ascending
  int64_t num_truncated_ = 0;
  int64_t num_empty_ = 0;

  mutable std::mutex mu_;
  mutable std::vector<int64_t> epoch_starts_{0};  // epoch_starts_[e]: first global index of epoch e
  mutable EpochPlan cached_;                      // the last planned epoch
};

// Batch b of the global order is computed by target b % T.
inline int batch_target(int64_t global_index, int num_targets) {
  return static_cast<int>(global_index % num_targets);
}

// Global batch indices in [begin, end) that target `target` of `num_targets` computes, in order.
std::vector<int64_t> batch_indices_for_target(int64_t begin, int64_t end, int target, int num_targets);

}  // namespace df
