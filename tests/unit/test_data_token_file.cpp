// Token file: round trips at awkward sizes, the validation messages (naming file and dataset), atomic
// replacement, write failures, and several files read as one corpus.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "core/error.h"
#include "data/token_file.h"
#include "test_data_util.h"

using namespace df;
using df_test::ScratchDir;

namespace {

// S sequences with lengths 1, 3, 7, 19, 0, 65, ... and tokens/masks that encode their position.
TokenData make_data(int64_t sequences, bool with_mask) {
  const int64_t lens[] = {1, 3, 7, 19, 0, 65};
  TokenData d;
  d.vocab_size = 1000;
  for (int64_t s = 0; s < sequences; ++s) {
    for (int64_t i = 0; i < lens[s % 6]; ++i) {
      d.tokens.push_back(static_cast<int32_t>((s * 31 + i * 7) % 1000));
      if (with_mask) d.loss_mask.push_back(static_cast<uint8_t>((s + i) % 3 != 0));
    }
    d.offsets.push_back(d.num_tokens());
  }
  return d;
}

void expect_error_mentions(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected df::Error";
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(TokenFile, RoundTripAwkwardSizes) {
  ScratchDir dir;
  for (int64_t s : {1, 3, 7, 19}) {
    for (bool mask : {true, false}) {
      TokenData d = make_data(s, mask);
      std::string path = dir.file("rt.h5");
      token_file_write(path, d);
      TokenData r = token_file_read(path);
      EXPECT_EQ(r.tokens, d.tokens);
      EXPECT_EQ(r.offsets, d.offsets);
      EXPECT_EQ(r.loss_mask, d.loss_mask);
      EXPECT_EQ(r.vocab_size, 1000);
    }
  }
}

TEST(TokenFile, ValidationNamesFileAndDataset) {
  ScratchDir dir;
  std::string p = dir.file("bad.h5");
  df_test::raw_token_file(p, {1, 2, 3}, {1, 3});
  expect_error_mentions([&] { token_file_read(p); }, {"bad.h5", "'offsets'", "start"});
  df_test::raw_token_file(p, {1, 2, 3}, {0, 2, 1, 3});
  expect_error_mentions([&] { token_file_read(p); }, {"bad.h5", "'offsets'", "decreases at entry 2"});
  df_test::raw_token_file(p, {1, 2, 3}, {0, 2});
  expect_error_mentions([&] { TokenCorpus c({p}); }, {"bad.h5", "'offsets' ends at 2", "3 tokens"});
  df_test::raw_token_file(p, {1, 2, 3}, {0, 3}, {1, 1});
  expect_error_mentions([&] { TokenCorpus c({p}); }, {"bad.h5", "'loss_mask' has 2", "3"});
  df_test::raw_token_file(p, {1, 2, 3}, {0, 3}, {1, 2, 1});
  expect_error_mentions([&] { token_file_read(p); }, {"bad.h5", "'loss_mask'", "0 and 1"});
  {
    hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    df_test::raw_write(f, "tokens", H5T_NATIVE_INT32, std::vector<int32_t>{1});
    H5Fclose(f);
  }
  expect_error_mentions([&] { TokenCorpus c({p}); }, {"bad.h5", "'offsets' is missing"});
  expect_error_mentions([&] { token_file_read(dir.file("absent.h5")); }, {"absent.h5", "cannot open"});
}

TEST(TokenFile, WriteRefusesInvalidDataAndLeavesNothing) {
  ScratchDir dir;
  TokenData d = make_data(3, true);
  d.loss_mask.pop_back();
  expect_error_mentions([&] { token_file_write(dir.file("x.h5"), d); }, {"x.h5", "loss_mask"});
  d = make_data(3, false);
  d.tokens[0] = 1000;  // == vocab_size
  EXPECT_THROW(token_file_write(dir.file("x.h5"), d), Error);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(TokenFile, WriteFailureNamesPathAndLeavesNoTemp) {
  ScratchDir dir;
  std::string p = dir.file("no_such_dir/out.h5");
  expect_error_mentions([&] { token_file_write(p, make_data(3, true)); }, {p});
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(TokenFile, RewriteReplacesAtomically) {
  ScratchDir dir;
  std::string p = dir.file("f.h5");
  token_file_write(p, make_data(3, true));
  token_file_write(p, make_data(7, false));
  EXPECT_EQ(token_file_read(p).num_sequences(), 7);
  // Only the final file remains: the temporary was renamed, not left behind.
  auto it = std::filesystem::directory_iterator(dir.path());
  EXPECT_EQ(std::distance(it, std::filesystem::directory_iterator()), 1);
}

// The prompt rule: cut before the first loss_mask 0→1 step, else the whole sequence (no mask, all ones, all
// zeros); a leading run of ones is not a response (nothing precedes it) and later steps do not move the cut.
TEST(TokenFile, PromptLengthCutsAtTheFirstZeroToOneStep) {
  struct Case {
    std::vector<uint8_t> mask;
    int64_t want;
  } cases[] = {
      {{0, 0, 1, 1}, 2}, {{0, 1, 0, 1}, 1},    {{1, 1, 0, 0, 1, 1}, 4}, {{0, 0, 0, 1}, 3}, {{1, 1, 1}, 3},
      {{0, 0, 0}, 3},    {{1, 0, 0}, 3},       {{1}, 1},                {{0}, 1},          {{0, 1}, 1},
  };
  for (const Case& c : cases) {
    TokenData d;
    d.tokens.assign(c.mask.size(), 5);
    d.loss_mask = c.mask;
    d.offsets.push_back(d.num_tokens());
    std::string m;
    for (uint8_t x : c.mask) m += char('0' + x);
    EXPECT_EQ(token_data_prompt_length(d, 0), c.want) << "mask " << m;
    d.loss_mask.clear();  // no mask: the whole sequence
    EXPECT_EQ(token_data_prompt_length(d, 0), int64_t(c.mask.size())) << "mask " << m << " dropped";
  }
  // Sequences of a multi-sequence file are cut on their own (a step across a boundary is no step), and an
  // empty one has an empty prompt.
  TokenData d;
  d.tokens = {1, 2, 3, 4, 5, 6};
  d.loss_mask = {0, 0, 1, 1, 1, 0};
  d.offsets = {0, 2, 2, 4, 6};
  EXPECT_EQ(token_data_prompt_length(d, 0), 2);
  EXPECT_EQ(token_data_prompt_length(d, 1), 0);
  EXPECT_EQ(token_data_prompt_length(d, 2), 2);
  EXPECT_EQ(token_data_prompt_length(d, 3), 2);
}

TEST(TokenCorpus, SeveralFilesShareOneSequenceIndex) {
  ScratchDir dir;
  TokenData a = make_data(3, true), b = make_data(7, false), c = make_data(1, true);
  token_file_write(dir.file("a.h5"), a);
  token_file_write(dir.file("b.h5"), b);
  token_file_write(dir.file("c.h5"), c);
  TokenCorpus corpus({dir.file("a.h5"), dir.file("b.h5"), dir.file("c.h5")});
  ASSERT_EQ(corpus.num_sequences(), 11);
  EXPECT_EQ(corpus.num_tokens(), a.num_tokens() + b.num_tokens() + c.num_tokens());
  EXPECT_EQ(corpus.vocab_size(), 1000);
  EXPECT_NE(corpus.describe(5).find("b.h5 sequence 2"), std::string::npos);
  // Global sequence 6 is b's sequence 3 (19 tokens); read a middle range of it.
  ASSERT_EQ(corpus.sequence_length(6), 19);
  std::vector<int32_t> tok(5);
  std::vector<uint8_t> mask(5, 7);
  corpus.read(6, 4, 5, tok.data(), mask.data());
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(tok[i], b.tokens[b.offsets[3] + 4 + i]);
    EXPECT_EQ(mask[i], 1);  // b has no mask: all tokens train
  }
  corpus.read(1, 0, 3, tok.data(), mask.data());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(mask[i], a.loss_mask[a.offsets[1] + i]);
  EXPECT_THROW(corpus.read(6, 15, 5, tok.data(), mask.data()), Error);
  EXPECT_THROW(corpus.read(11, 0, 1, tok.data(), mask.data()), Error);
}

TEST(TokenCorpus, FilesMustAgreeOnVocabulary) {
  ScratchDir dir;
  TokenData a = make_data(3, true);
  token_file_write(dir.file("a.h5"), a);
  a.vocab_size = 2000;
  token_file_write(dir.file("b.h5"), a);
  expect_error_mentions([&] { TokenCorpus c({dir.file("a.h5"), dir.file("b.h5")}); }, {"b.h5", "vocab_size"});
}
