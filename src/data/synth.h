// Synthetic token corpora that a drafter can actually learn, for the CPU demo and the tests: a sparse
// random Markov chain (each token has 2-3 likely successors) with repeated motifs spliced in and a little
// uniform noise. The first part of every sequence is a "prompt" with loss_mask 0. Fully seed-determined.
#pragma once
#include <cstdint>

#include "data/token_file.h"

namespace df {

struct SynthOptions {
  int64_t vocab_size = 0;
  int64_t sequences = 0;
  int64_t min_len = 0;
  int64_t max_len = 0;
  uint64_t seed = 0;
};

TokenData synth_generate(const SynthOptions& options);

}  // namespace df
