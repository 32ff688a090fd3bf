// The feature file: what extract writes is read back by offline training exactly (bf16 stored as bf16 bits,
// float32 rounded to bf16 on read), taps land in their column block of a strided row, the file doubles as a
// token file of its sequences, and a missing tap or a foreign file is an error naming the file.
#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/error.h"
#include "data/feature_file.h"
#include "golden_util.h"

namespace df {
namespace {

TokenData three_sequences() {
  TokenData d;
  d.vocab_size = 50;
  for (int s = 0; s < 3; ++s) {
    for (int t = 0; t < 5 + 4 * s; ++t) {
      d.tokens.push_back((7 * s + 3 * t) % 50);
      d.loss_mask.push_back(t % 3 != 0);
    }
    d.offsets.push_back(d.num_tokens());
  }
  return d;
}

float value_at(int layer, int64_t r, int64_t c) { return 0.01f * float(layer * 1000 + r * 7 + c) - 3.0f; }

TEST(FeatureFile, RoundTripBf16AndF32IntoStridedRows) {
  golden::ScratchDir dir("features");
  const TokenData tok = three_sequences();
  const int64_t N = tok.num_tokens(), H = 6;
  const std::vector<int> layers = {3, 1};
  for (bool bf16 : {true, false}) {
    const std::string path = (dir.path / (bf16 ? "bf16.h5" : "f32.h5")).string();
    {
      FeatureFileWriter w(path, {"final_norm", "layer_3", "layer_1"}, tok, H, bf16, layers);
      for (size_t i = 0; i < 3; ++i) {
        const int layer = i == 0 ? 99 : layers[i - 1];
        std::vector<float> v(size_t(N * H));
        for (int64_t r = 0; r < N; ++r)
          for (int64_t c = 0; c < H; ++c) v[size_t(r * H + c)] = value_at(layer, r, c);
        w.write_rows(i, 0, 7, v.data());  // two row ranges: the writer fills hyperslabs
        w.write_rows(i, 7, N - 7, v.data() + 7 * H);
      }
      w.finish();
    }
    FeatureFileReader rd(path);
    EXPECT_EQ(rd.hidden(), H);
    EXPECT_EQ(rd.rows(), N);
    EXPECT_EQ(rd.layer_ids(), layers);
    EXPECT_EQ(rd.tokens_fingerprint(), token_data_fingerprint(tok));
    EXPECT_TRUE(rd.has_final_norm());
    // Rows 4..10 of taps (1, 3) into rows of stride 2·H + 3 (a guard gap at the end of each row).
    const int64_t ld = 2 * H + 3, row0 = 4, n = 7;
    std::vector<uint16_t> out(size_t(n * ld), 0xFFFF);
    rd.read_taps({1, 3}, row0, n, out.data(), ld);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < 2 * H; ++c) {
        const int layer = c < H ? 1 : 3;
        EXPECT_EQ(out[size_t(r * ld + c)], f32_to_bf16(value_at(layer, row0 + r, c % H))) << r << "," << c;
      }
      for (int64_t c = 2 * H; c < ld; ++c) EXPECT_EQ(out[size_t(r * ld + c)], 0xFFFF) << "guard overwritten";
    }
    std::vector<uint16_t> fin(static_cast<size_t>(H), 0);
    rd.read_final_norm(N - 1, 1, fin.data(), H);
    EXPECT_EQ(fin[2], f32_to_bf16(value_at(99, N - 1, 2)));
    try {
      rd.read_taps({2}, 0, 1, out.data(), ld);
      FAIL() << "a tap the file does not hold was read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("holds no layer_2 (it has the taps of layers 3,1)"), std::string::npos)
          << e.what();
    }
    // The feature file is a token file of the same sequences.
    const TokenData back = token_file_read(path);
    EXPECT_EQ(back.tokens, tok.tokens);
    EXPECT_EQ(back.loss_mask, tok.loss_mask);
    EXPECT_EQ(back.offsets, tok.offsets);
  }
  TokenData other = tok;
  other.tokens[3] ^= 1;
  EXPECT_NE(token_data_fingerprint(other), token_data_fingerprint(tok));  // content, not only lengths
  const std::string plain = (dir.path / "tokens.h5").string();
  token_file_write(plain, tok);
  try {
    FeatureFileReader rd(plain);
    FAIL() << "a token file was accepted as features";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attribute 'hidden' missing"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace df
