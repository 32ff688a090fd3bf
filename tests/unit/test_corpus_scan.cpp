// TokenCorpus::scan, what a run checks about its data before step 1: the content hash behind the checkpoint's
// data fingerprint (a token edited in place changes it, lengths alone do not decide), the count of positions
// a block can anchor at, and a token id outside the target's vocabulary named by file and sequence.
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/token_file.h"
#include "test_data_util.h"

using namespace df;
using df_test::ScratchDir;

namespace {

TokenData three_sequences() {
  TokenData d;
  d.tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  d.offsets = {0, 4, 5, 9};  // lengths 4, 1, 4
  d.loss_mask = {0, 1, 1, 1, 1, 1, 0, 1, 1};
  return d;
}

std::string scan_error(const std::string& path, int64_t vocab) {
  try {
    TokenCorpus({path}).scan(vocab, 100);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(CorpusScan, ContentHashSeesAnEditedTokenWithTheSameLengths) {
  ScratchDir d;
  TokenData a = three_sequences();
  token_file_write(d.file("a.h5"), a);
  TokenData b = a;
  b.tokens[6] = 42;  // same lengths, same mask, one token changed
  token_file_write(d.file("b.h5"), b);
  TokenData c = a;
  c.loss_mask[0] = 1;  // only the mask changed
  token_file_write(d.file("c.h5"), c);
  const uint64_t ha = TokenCorpus({d.file("a.h5")}).scan(0, 100).content_hash;
  EXPECT_EQ(ha, TokenCorpus({d.file("a.h5")}).scan(0, 100).content_hash);
  EXPECT_NE(ha, TokenCorpus({d.file("b.h5")}).scan(0, 100).content_hash);
  EXPECT_NE(ha, TokenCorpus({d.file("c.h5")}).scan(0, 100).content_hash);
}

TEST(CorpusScan, AnchorPositionsFollowTheMaskAndTheTruncation) {
  ScratchDir d;
  token_file_write(d.file("a.h5"), three_sequences());
  TokenCorpus corpus({d.file("a.h5")});
  // Sequence 0: mask 0111 -> pairs (1,2), (2,3); sequence 1 has one token; sequence 2: 1011 -> (2,3).
  EXPECT_EQ(corpus.scan(0, 100).anchor_positions, 3);
  EXPECT_EQ(corpus.scan(0, 3).anchor_positions, 1);  // truncated to 3 tokens: only (1,2) of sequence 0
}

TEST(CorpusScan, TokenOutsideTheVocabularyNamesFileAndSequence) {
  ScratchDir d;
  token_file_write(d.file("a.h5"), three_sequences());
  EXPECT_EQ(scan_error(d.file("a.h5"), 10), "");
  const std::string msg = scan_error(d.file("a.h5"), 6);
  EXPECT_NE(msg.find("a.h5 sequence 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("token id 6 is outside the vocabulary [0, 6)"), std::string::npos) << msg;
}
