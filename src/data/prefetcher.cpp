// Prefetch thread: batch_at + corpus reads, one batch at a time, into q_pre. Shutdown closes the queue so
// a producer blocked on a full queue wakes; an exception closes it with the error for the consumer.
#include "data/prefetcher.h"

#include "core/error.h"

namespace df {

MaterialisedBatch batch_materialise(const TokenCorpus& corpus, const Batch& batch) {
  MaterialisedBatch out;
  out.global_index = batch.global_index;
  out.epoch = batch.epoch;
  int64_t n = batch.num_tokens();
  out.tokens.resize(static_cast<size_t>(n));
  out.loss_mask.resize(static_cast<size_t>(n));
  out.offsets.reserve(batch.items.size() + 1);
  out.sequence_ids.reserve(batch.items.size());
  int64_t at = 0;
  out.offsets.push_back(0);
  for (const BatchItem& it : batch.items) {
    corpus.read(it.seq, it.start, it.length, out.tokens.data() + at, out.loss_mask.data() + at);
    at += it.length;
    out.offsets.push_back(at);
    out.sequence_ids.push_back(it.seq);
  }
  return out;
}

Prefetcher::Prefetcher(const TokenCorpus& corpus, const Batcher& batcher, std::vector<int64_t> batch_indices,
                       size_t capacity)
    : corpus_(corpus), batcher_(batcher), indices_(std::move(batch_indices)), queue_(capacity) {
  thread_ = std::thread([this] { run(); });
}

Prefetcher::~Prefetcher() {
  stop_.store(true);
  queue_.close();
  if (thread_.joinable()) thread_.join();
}

void Prefetcher::run() {
  try {
    for (int64_t g : indices_) {
      if (stop_.load()) break;
      if (!queue_.push(batch_materialise(corpus_, batcher_.batch_at(g)))) break;
    }
    queue_.close();
  } catch (...) {
    queue_.fail(std::current_exception());
  }
}

}  // namespace df
