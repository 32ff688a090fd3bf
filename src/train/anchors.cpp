// Anchor sampling by a partial Fisher–Yates shuffle of the candidate positions: exactly uniform over subsets
// and O(candidates) per sequence.
#include "train/anchors.h"

#include <algorithm>

#include "core/error.h"

namespace df {

std::vector<int32_t> anchors_sample_sequence(const uint8_t* loss_mask, int64_t len, int max_anchors, Rng& rng) {
  DF_CHECK(max_anchors >= 0, "anchors: num_anchors %d must be ≥ 0", max_anchors);
  std::vector<int32_t> cand;
  for (int64_t a = 0; a + 1 < len; ++a)
    if (loss_mask[a] && loss_mask[a + 1]) cand.push_back(int32_t(a));
  const size_t n = std::min(cand.size(), size_t(max_anchors));
  if (n < cand.size())
    for (size_t i = 0; i < n; ++i) std::swap(cand[i], cand[i + size_t(rng.below(cand.size() - i))]);
  cand.resize(n);
  std::sort(cand.begin(), cand.end());
  return cand;
}

std::vector<DrafterAnchor> anchors_sample_batch(const DrafterBatch& batch, int max_anchors, Rng& rng, int pad_to) {
  DF_CHECK(pad_to >= 1, "anchors: pad_to %d must be ≥ 1", pad_to);
  std::vector<DrafterAnchor> out;
  for (int s = 0; s < batch.num_seqs(); ++s) {
    const int64_t s0 = batch.offsets[size_t(s)], len = batch.offsets[size_t(s) + 1] - s0;
    for (int32_t a : anchors_sample_sequence(batch.loss_mask.data() + s0, len, max_anchors, rng)) out.push_back({s, a});
  }
  while (out.size() % size_t(pad_to) != 0) out.push_back({0, -1});
  return out;
}

int64_t anchors_cap(std::vector<DrafterAnchor>& anchors, int64_t max_blocks, Rng& rng) {
  DF_CHECK(max_blocks >= 0, "anchors: max_blocks %lld must be ≥ 0", (long long)max_blocks);
  const size_t n = anchors.size();
  if (max_blocks == 0 || n <= size_t(max_blocks)) return 0;
  std::vector<size_t> idx(n);
  for (size_t i = 0; i < n; ++i) idx[i] = i;
  for (size_t i = 0; i < size_t(max_blocks); ++i) std::swap(idx[i], idx[i + size_t(rng.below(n - i))]);
  idx.resize(size_t(max_blocks));
  std::sort(idx.begin(), idx.end());
  std::vector<DrafterAnchor> kept;
  kept.reserve(idx.size());
  for (size_t i : idx) kept.push_back(anchors[i]);
  anchors.swap(kept);
  return int64_t(n - idx.size());
}

}  // namespace df
