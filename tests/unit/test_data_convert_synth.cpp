// JSONL conversion (records, defaults, every error with its line number) and the synthetic corpus
// (determinism, shape, prompt masks, and that it is far more predictable than uniform tokens).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/error.h"
#include "data/jsonl_convert.h"
#include "data/synth.h"
#include "test_data_util.h"

using namespace df;

namespace {

std::string parse_error(const std::string& text, int64_t vocab = 100) {
  std::istringstream in(text);
  try {
    jsonl_parse_tokens(in, "x.jsonl", vocab);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(JsonlConvert, RecordsWithAndWithoutMask) {
  std::istringstream in("{\"input_ids\": [1, 2, 3]}\n"
                        "{\"input_ids\": [4, 99], \"loss_mask\": [0, 1], \"extra\": \"ignored\"}\n"
                        "{\"input_ids\": [7], \"loss_mask\": [true]}\n");
  TokenData d = jsonl_parse_tokens(in, "x.jsonl", 100);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{1, 2, 3, 4, 99, 7}));
  EXPECT_EQ(d.offsets, (std::vector<int64_t>{0, 3, 5, 6}));
  EXPECT_EQ(d.loss_mask, (std::vector<uint8_t>{1, 1, 1, 0, 1, 1}));
  EXPECT_EQ(d.vocab_size, 100);
}

TEST(JsonlConvert, ErrorsNameTheLine) {
  const std::string ok = "{\"input_ids\": [1]}\n";
  struct Case {
    std::string text, expect;
  } cases[] = {
      {ok + "{\"input_ids\": [1, 2\n", "x.jsonl line 2: not valid JSON"},
      {ok + ok + "\n" + ok, "x.jsonl line 3: empty line"},
      {ok + "{\"input_ids\": []}\n", "line 2: 'input_ids' is empty"},
      {"{\"input_ids\": [3, 100]}\n", "line 1: input_ids[1] = 100 is outside the vocabulary [0, 100)"},
      {ok + ok + ok + "{\"input_ids\": [-1]}\n", "line 4: input_ids[0] = -1"},
      {ok + "{\"input_ids\": [1, 2], \"loss_mask\": [1]}\n", "line 2: 'loss_mask' has 1 entries but 'input_ids' has 2"},
      {ok + "{\"input_ids\": [1], \"loss_mask\": [2]}\n", "line 2: loss_mask[0] must be 0 or 1"},
      {ok + "{\"input_ids\": [1.5]}\n", "line 2: input_ids[0] is not an integer"},
      {ok + "{\"ids\": [1]}\n", "line 2: missing the array 'input_ids'"},
      {ok + "[1, 2]\n", "line 2: expected a JSON object"},
      {"", "no records"},
  };
  for (const Case& c : cases) EXPECT_NE(parse_error(c.text).find(c.expect), std::string::npos) << parse_error(c.text);
  EXPECT_NE(parse_error(ok, 0).find("--vocab"), std::string::npos);
}

TEST(JsonlConvert, FileRoundTrip) {
  df_test::ScratchDir dir;
  {
    std::ofstream f(dir.file("in.jsonl"));
    f << "{\"input_ids\": [5, 6, 7], \"loss_mask\": [0, 0, 1]}\n{\"input_ids\": [8]}\n";
  }
  jsonl_convert_file(dir.file("in.jsonl"), dir.file("out.h5"), 10);
  TokenData d = token_file_read(dir.file("out.h5"));
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(d.loss_mask, (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_THROW(jsonl_convert_file(dir.file("missing.jsonl"), dir.file("o.h5"), 10), Error);
}

TEST(Synth, DeterministicFromSeed) {
  SynthOptions o{.vocab_size = 97, .sequences = 19, .min_len = 3, .max_len = 65, .seed = 7};
  TokenData a = synth_generate(o), b = synth_generate(o);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.offsets, b.offsets);
  EXPECT_EQ(a.loss_mask, b.loss_mask);
  o.seed = 8;
  EXPECT_NE(synth_generate(o).tokens, a.tokens);
}

TEST(Synth, ShapeAndPromptMask) {
  SynthOptions o{.vocab_size = 97, .sequences = 65, .min_len = 3, .max_len = 19, .seed = 1};
  TokenData d = synth_generate(o);
  token_data_validate(d, "synth");
  ASSERT_EQ(d.num_sequences(), 65);
  for (int64_t s = 0; s < d.num_sequences(); ++s) {
    int64_t len = d.sequence_length(s);
    EXPECT_GE(len, 3);
    EXPECT_LE(len, 19);
    // A non-empty prompt of zeros, then ones to the end.
    const uint8_t* m = d.loss_mask.data() + d.offsets[s];
    EXPECT_EQ(m[0], 0);
    EXPECT_EQ(m[len - 1], 1);
    for (int64_t i = 1; i < len; ++i) EXPECT_GE(m[i], m[i - 1]);
  }
  EXPECT_THROW(synth_generate({.vocab_size = 4, .sequences = 1, .min_len = 2, .max_len = 2, .seed = 0}), Error);
  EXPECT_THROW(synth_generate({.vocab_size = 97, .sequences = 1, .min_len = 9, .max_len = 3, .seed = 0}), Error);
}

TEST(Synth, NextTokenFarMorePredictableThanUniform) {
  SynthOptions o{.vocab_size = 256, .sequences = 400, .min_len = 200, .max_len = 400, .seed = 3};
  TokenData d = synth_generate(o);
  // Plug-in conditional entropy H(next | previous) in bits over all in-sequence pairs.
  std::map<int32_t, std::map<int32_t, int64_t>> pairs;
  int64_t total = 0;
  for (int64_t s = 0; s < d.num_sequences(); ++s)
    for (int64_t i = d.offsets[s] + 1; i < d.offsets[s + 1]; ++i, ++total) ++pairs[d.tokens[i - 1]][d.tokens[i]];
  double h = 0;
  for (const auto& [prev, nexts] : pairs) {
    int64_t n = 0;
    for (const auto& [t, c] : nexts) n += c;
    for (const auto& [t, c] : nexts) h -= static_cast<double>(c) / total * std::log2(static_cast<double>(c) / n);
  }
  // Uniform tokens give log2(256) = 8 bits. The chain alone gives ~1.1 bits; motifs (8%) and noise (3%)
  // add roughly 1 bit more. ~120k pairs over 256 contexts make the plug-in estimate's bias small (< 0.1).
  std::printf("synth: conditional entropy %.2f bits per token (uniform: 8)\n", h);
  EXPECT_LT(h, 3.0) << "conditional entropy " << h << " bits";
  EXPECT_GT(h, 0.5) << "conditional entropy " << h << " bits: the corpus is degenerate";
}
