// Length bucketing, per-epoch seeded shuffling and greedy token-budget packing. Packing after the shuffle
// means the batch count can differ slightly between epochs, so global indices map to epochs through
// cumulative per-epoch counts, computed on demand and kept.
#include "data/batcher.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"

namespace df {

namespace {
// Stream tags so the bucket shuffles and the batch order draw from unrelated generators.
constexpr uint64_t kShuffleStream = 0x5348554646ull;  // "SHUFF"
constexpr uint64_t kOrderStream = 0x4f52444552ull;    // "ORDER"
}  // namespace

int64_t Batch::num_tokens() const {
  int64_t n = 0;
  for (const BatchItem& it : items) n += it.length;
  return n;
}

Batcher::Batcher(std::vector<int64_t> sequence_lengths, BatcherOptions options)
    : options_(std::move(options)), lengths_(std::move(sequence_lengths)) {
  DF_CHECK(options_.token_budget > 0, "token_budget is %lld; it must be positive (tokens per batch)",
           static_cast<long long>(options_.token_budget));
  const std::vector<int64_t>& bounds = options_.bucket_bounds;
  for (size_t i = 0; i < bounds.size(); ++i)
    DF_CHECK(bounds[i] > 0 && (i == 0 || bounds[i] > bounds[i - 1]),
             "bucket bounds must be positive and strictly ascending; entry %zu is %lld", i,
             static_cast<long long>(bounds[i]));
  fingerprint_ = rng_mix(rng_mix(options_.seed, static_cast<uint64_t>(options_.token_budget)), lengths_.size());
  for (int64_t b : bounds) fingerprint_ = rng_mix(fingerprint_, static_cast<uint64_t>(b));
  for (int64_t len : lengths_) fingerprint_ = rng_mix(fingerprint_, static_cast<uint64_t>(len));
  buckets_.resize(bounds.size() + 1);
  for (size_t s = 0; s < lengths_.size(); ++s) {
    int64_t& len = lengths_[s];
    DF_CHECK(len >= 0, "sequence %zu has negative length %lld", s, static_cast<long long>(len));
    if (len == 0) {
      ++num_empty_;
      continue;
    }
    if (len > options_.token_budget) {
      len = options_.token_budget;
      ++num_truncated_;
    }
    size_t b = static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), len) - bounds.begin());
    buckets_[b].push_back(static_cast<int64_t>(s));
  }
  DF_CHECK(num_empty_ < static_cast<int64_t>(lengths_.size()),
           "the corpus has no non-empty sequence (%zu sequences); check the token files", lengths_.size());
  if (num_truncated_ > 0)
    log_warn("%lld of %zu sequences are longer than token_budget=%lld and are cut to their first %lld tokens",
             static_cast<long long>(num_truncated_), lengths_.size(), static_cast<long long>(options_.token_budget),
             static_cast<long long>(options_.token_budget));
  if (num_empty_ > 0)
    log_warn("%lld empty sequences are skipped", static_cast<long long>(num_empty_));
}

Batcher::EpochPlan Batcher::plan_epoch(int64_t epoch) const {
  const uint64_t epoch_seed = rng_mix(options_.seed, static_cast<uint64_t>(epoch));
  // Pack each bucket after its shuffle; batches are ranges of `packed`.
  std::vector<BatchItem> packed;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    std::vector<int64_t> order = buckets_[b];
    Rng rng(rng_mix(rng_mix(epoch_seed, kShuffleStream), b));
    rng_shuffle(rng, order);
    int64_t begin = static_cast<int64_t>(packed.size()), tokens = 0;
    for (int64_t s : order) {
      int64_t len = lengths_[static_cast<size_t>(s)];
      if (tokens + len > options_.token_budget && tokens > 0) {
        ranges.emplace_back(begin, static_cast<int64_t>(packed.size()));
        begin = static_cast<int64_t>(packed.size());
        tokens = 0;
      }
      packed.push_back({s, 0, len});
      tokens += len;
    }
    if (tokens > 0) ranges.emplace_back(begin, static_cast<int64_t>(packed.size()));
  }
  Rng order_rng(rng_mix(epoch_seed, kOrderStream));
  rng_shuffle(order_rng, ranges);

  EpochPlan plan;
  plan.epoch = epoch;
  plan.items.reserve(packed.size());
  plan.batch_begin.reserve(ranges.size() + 1);
  for (const auto& [lo, hi] : ranges) {
    plan.batch_begin.push_back(static_cast<int64_t>(plan.items.size()));
    plan.items.insert(plan.items.end(), packed.begin() + lo, packed.begin() + hi);
  }
  plan.batch_begin.push_back(static_cast<int64_t>(plan.items.size()));
  return plan;
}

void Batcher::extend_epoch_starts_locked(int64_t epoch) const {
  while (static_cast<int64_t>(epoch_starts_.size()) <= epoch + 1) {
    int64_t e = static_cast<int64_t>(epoch_starts_.size()) - 1;
    if (cached_.epoch != e) cached_ = plan_epoch(e);
    epoch_starts_.push_back(epoch_starts_.back() + static_cast<int64_t>(cached_.batch_begin.size()) - 1);
  }
}

int64_t Batcher::epoch_start(int64_t epoch) const {
  DF_CHECK(epoch >= 0, "epoch %lld is negative", static_cast<long long>(epoch));
  std::lock_guard<std::mutex> lock(mu_);
  extend_epoch_starts_locked(epoch);
  return epoch_starts_[static_cast<size_t>(epoch)];
}

int64_t Batcher::batches_in_epoch(int64_t epoch) const {
  DF_CHECK(epoch >= 0, "epoch %lld is negative", static_cast<long long>(epoch));
  std::lock_guard<std::mutex> lock(mu_);
  extend_epoch_starts_locked(epoch);
  return epoch_starts_[static_cast<size_t>(epoch) + 1] - epoch_starts_[static_cast<size_t>(epoch)];
}

Batch Batcher::batch_at(int64_t global_index) const {
  DF_CHECK(global_index >= 0, "batch index %lld is negative", static_cast<long long>(global_index));
  std::lock_guard<std::mutex> lock(mu_);
  // Every epoch holds at least one batch, so epoch <= global_index; grow until the index is covered.
  while (epoch_starts_.back() <= global_index)
    extend_epoch_starts_locked(static_cast<int64_t>(epoch_starts_.size()) - 1);
  auto it = std::upper_bound(epoch_starts_.begin(), epoch_starts_.end(), global_index);
  int64_t epoch = static_cast<int64_t>(it - epoch_starts_.begin()) - 1;
  if (cached_.epoch != epoch) cached_ = plan_epoch(epoch);
  Batch batch;
  batch.global_index = global_index;
  batch.epoch = epoch;
  batch.index_in_epoch = global_index - epoch_starts_[static_cast<size_t>(epoch)];
  size_t i = static_cast<size_t>(batch.index_in_epoch);
  batch.items.assign(cached_.items.begin() + cached_.batch_begin[i], cached_.items.begin() + cached_.batch_begin[i + 1]);
  return batch;
}

std::vector<int64_t> batch_indices_for_target(int64_t begin, int64_t end, int target, int num_targets) {
  DF_CHECK(num_targets > 0 && target >= 0 && target < num_targets, "target %d is not in [0, %d)", target,
           num_targets);
  std::vector<int64_t> out;
  int64_t first = begin + ((target - begin % num_targets) % num_targets + num_targets) % num_targets;
  for (int64_t g = first; g < end; g += num_targets) out.push_back(g);
  return out;
}

}  // namespace df
