// The generator behind `dflash_mpi data synth`. Its knobs are fixed so the corpus has a known shape: a
// next-token entropy of roughly 1.5-2 bits whatever the vocabulary, far below log2(V), so a few hundred
// drafter steps show a falling loss and a rising acceptance length.
#include "data/synth.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/rng.h"

namespace df {

namespace {
constexpr int kMotifs = 16;
constexpr int64_t kMotifMinLen = 4, kMotifMaxLen = 8;
constexpr double kMotifProb = 0.08;  // chance per step to splice in a whole motif
constexpr double kNoiseProb = 0.03;  // chance per step of a uniformly random token
constexpr double kProbs2[2] = {0.7, 0.3};
constexpr double kProbs3[3] = {0.6, 0.3, 0.1};

struct Chain {
  std::vector<int32_t> next;  // 3 successor slots per token
  std::vector<uint8_t> count; // 2 or 3 used
};

Chain chain_make(int64_t vocab, Rng& rng) {
  Chain c;
  c.next.resize(static_cast<size_t>(vocab) * 3);
  c.count.resize(static_cast<size_t>(vocab));
  for (int64_t t = 0; t < vocab; ++t) {
    int k = 2 + static_cast<int>(rng.below(2));
    c.count[t] = static_cast<uint8_t>(k);
    for (int j = 0; j < k; ++j) {
      int32_t s;
      bool fresh;
      do {  // distinct successors, so the probabilities above are the real ones
        s = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
        fresh = true;
        for (int i = 0; i < j; ++i) fresh = fresh && c.next[t * 3 + i] != s;
      } while (!fresh);
      c.next[t * 3 + j] = s;
    }
  }
  return c;
}

int32_t chain_step(const Chain& c, int32_t t, Rng& rng) {
  int k = c.count[t];
  const double* p = k == 2 ? kProbs2 : kProbs3;
  double u = rng.uniform();
  for (int j = 0; j < k - 1; ++j) {
    if (u < p[j]) return c.next[t * 3 + j];
    u -= p[j];
  }
  return c.next[t * 3 + k - 1];
}

}  // namespace

TokenData synth_generate(const SynthOptions& o) {
  DF_CHECK(o.vocab_size >= 8 && o.vocab_size <= (int64_t{1} << 31) - 1, "--vocab %lld must be in [8, 2^31-1]",
           static_cast<long long>(o.vocab_size));
  DF_CHECK(o.sequences > 0, "--sequences %lld must be positive", static_cast<long long>(o.sequences));
  DF_CHECK(o.min_len >= 2 && o.max_len >= o.min_len, "--min-len %lld / --max-len %lld: need 2 <= min-len <= max-len",
           static_cast<long long>(o.min_len), static_cast<long long>(o.max_len));
  // The corpus is built in memory: 4 bytes of token id and 1 of loss mask per token, mean length (min+max)/2.
  host_memory_check(double(o.sequences) * 0.5 * (double(o.min_len) + double(o.max_len)) * 5.0,
                    strfmt("data synth of %lld sequences of %lld..%lld tokens", static_cast<long long>(o.sequences),
                           static_cast<long long>(o.min_len), static_cast<long long>(o.max_len)),
                    "fewer --sequences or a smaller --max-len (several files can form one corpus)");
  Rng structure(rng_mix(o.seed, 1));
  Chain chain = chain_make(o.vocab_size, structure);
  std::vector<std::vector<int32_t>> motifs(kMotifs);
  for (auto& m : motifs) {
    m.resize(static_cast<size_t>(structure.range(kMotifMinLen, kMotifMaxLen)));
    for (int32_t& t : m) t = static_cast<int32_t>(structure.below(static_cast<uint64_t>(o.vocab_size)));
  }

  TokenData data;
  data.vocab_size = o.vocab_size;
  Rng rng(rng_mix(o.seed, 2));
  for (int64_t s = 0; s < o.sequences; ++s) {
    int64_t len = rng.range(o.min_len, o.max_len);
    int64_t prompt = rng.range(1, std::max<int64_t>(1, len / 3));
    int64_t begin = data.num_tokens();
    int32_t t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(o.vocab_size)));
    data.tokens.push_back(t);
    while (data.num_tokens() - begin < len) {
      double u = rng.uniform();
      if (u < kMotifProb) {
        const std::vector<int32_t>& m = motifs[rng.below(kMotifs)];
        for (size_t i = 0; i < m.size() && data.num_tokens() - begin < len; ++i) data.tokens.push_back(m[i]);
      } else if (u < kMotifProb + kNoiseProb) {
        data.tokens.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(o.vocab_size))));
      } else {
        data.tokens.push_back(chain_step(chain, data.tokens.back(), rng));
      }
    }
    for (int64_t i = 0; i < len; ++i) data.loss_mask.push_back(i < prompt ? 0 : 1);
    data.offsets.push_back(data.num_tokens());
  }
  return data;
}

}  // namespace df
