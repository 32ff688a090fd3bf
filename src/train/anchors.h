// Anchor sampling: which positions of a sequence start a training block. Uniform without replacement among
// the positions a with loss_mask[a] && loss_mask[a+1], up to num_anchors, sorted; re-drawn every time a
// sequence is used, from the caller's Rng so a checkpoint that stores the Rng resumes the same draws.
#pragma once
#include <cstdint>
#include <vector>

#include "model/drafter.h"
#include "core/rng.h"

namespace df {

// Sorted anchor positions for one sequence of `len` tokens.
std::vector<int32_t> anchors_sample_sequence(const uint8_t* loss_mask, int64_t len, int max_anchors, Rng& rng);

// Anchors of every sequence of the batch, sequence by sequence, then padding blocks (pos −1) up to a
// multiple of pad_to (fixed shapes for graph capture on the GPU; 1 = no padding).
std::vector<DrafterAnchor> anchors_sample_batch(const DrafterBatch& batch, int max_anchors, Rng& rng, int pad_to = 1);

// Keeps at most max_blocks of `anchors`, a subset chosen uniformly at random from rng (partial Fisher–Yates
// over the indices), in their original order; returns how many were dropped. max_blocks 0: no cap (rng is
// then not drawn from, nor when nothing is over the cap).
int64_t anchors_cap(std::vector<DrafterAnchor>& anchors, int64_t max_blocks, Rng& rng);

}  // namespace df
