// What `eval` takes as the prompt of each sequence (issue 28): a prompts file from `data convert` is taken
// whole, a conversation from `data tokenize` is cut where its first assistant turn begins, and an empty
// sequence is refused naming the file and its index. The rule itself is token_data_prompt_length
// (test_data_token_file.cpp).
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "core/error.h"
#include "data/jsonl_convert.h"
#include "pipeline/eval.h"
#ifdef DF_HAVE_TOKENIZER
#include "data/chat_tokenize.h"
#endif

using namespace df;

TEST(EvalPrompt, ConvertedPromptsAreTakenWhole) {
  std::istringstream in("{\"input_ids\": [3, 1, 4]}\n{\"input_ids\": [1]}\n{\"input_ids\": [5, 9, 2, 6]}\n");
  JsonlReport rep;
  const TokenData d = jsonl_parse_tokens(in, "p.jsonl", 10, 0, &rep);
  EXPECT_TRUE(d.loss_mask.empty()) << "no record has a loss_mask: none is written";
  EXPECT_EQ(rep.unmasked, 3);
  EXPECT_EQ(eval_prompt(d, 0, "p.h5"), (std::vector<int32_t>{3, 1, 4}));
  EXPECT_EQ(eval_prompt(d, 1, "p.h5"), (std::vector<int32_t>{1}));
  EXPECT_EQ(eval_prompt(d, 2, "p.h5"), (std::vector<int32_t>{5, 9, 2, 6}));

  // A file of all-ones masks (what `data convert` wrote before, or prompts given loss_mask 1 by hand) is the
  // same.
  TokenData ones = d;
  ones.loss_mask.assign(size_t(d.num_tokens()), 1);
  for (int64_t s = 0; s < d.num_sequences(); ++s)
    EXPECT_EQ(eval_prompt(ones, s, "p.h5"), eval_prompt(d, s, "p.h5"));

  // One record with a mask among records without: those are written as ones, the masked one is cut.
  std::istringstream mixed(
      "{\"input_ids\": [3, 1, 4]}\n{\"input_ids\": [7, 8, 9], \"loss_mask\": [0, 1, 1]}\n");
  const TokenData m = jsonl_parse_tokens(mixed, "m.jsonl", 10, 0, &rep);
  EXPECT_EQ(m.loss_mask, (std::vector<uint8_t>{1, 1, 1, 0, 1, 1}));
  EXPECT_EQ(rep.unmasked, 1);
  EXPECT_EQ(eval_prompt(m, 0, "m.h5"), (std::vector<int32_t>{3, 1, 4}));
  EXPECT_EQ(eval_prompt(m, 1, "m.h5"), (std::vector<int32_t>{7}));
}

TEST(EvalPrompt, EmptySequenceIsRefusedNamingFileAndIndex) {
  TokenData d;
  d.tokens = {1, 2, 3};
  d.offsets = {0, 2, 2, 3};  // sequence 1 is empty
  EXPECT_EQ(eval_prompt(d, 0, "prompts.h5"), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(eval_prompt(d, 2, "prompts.h5"), (std::vector<int32_t>{3}));
  try {
    eval_prompt(d, 1, "prompts.h5");
    FAIL() << "an empty sequence was accepted as a prompt";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* part : {"prompts.h5: sequence 1 is empty", "HINT:"})
      EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

#ifdef DF_HAVE_TOKENIZER
// The golden tokenizer (Hugging Face-trained, Qwen's special tokens) through Qwen3's chat template: the prompt is
// the rendered text up to and including the first "<|im_start|>assistant\n", whatever follows (a second turn,
// a reasoning block); a plain text record has no prompt/response step and is taken whole.
TEST(EvalPrompt, TokenizedConversationIsCutAtTheFirstAssistantTurn) {
  const std::string tj = std::string(DF_SOURCE_DIR) + "/tests/golden/tokenizer/tokenizer.json";
  BpeTokenizer tok(tj);
  std::istringstream in(
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}, )"
      R"({"role": "assistant", "content": "4", "reasoning_content": "Simple."}, {"role": "user", "content": "And )"
      R"(3+3?"}, {"role": "assistant", "content": "6"}]})"
      "\n"
      R"({"text": "plain text, trained whole"})"
      "\n");
  const std::string dir = std::string(DF_SOURCE_DIR) + "/tests/golden";
  const ChatRenderer chat(dir + "/chat/templates/qwen3.jinja", dir + "/tokenizer", {});
  TokenizeReport rep;
  const TokenData d = chat_tokenize_stream(in, "chats.jsonl", tok, chat, 0, 0, &rep);
  ASSERT_EQ(d.num_sequences(), 2);
  const std::vector<int32_t> want = tok.encode_ids(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is "
      "2+2?<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<int32_t> p = eval_prompt(d, 0, "chats.h5");
  EXPECT_EQ(p, want);
  ASSERT_LT(int64_t(p.size()), d.sequence_length(0));
  EXPECT_EQ(d.loss_mask[p.size()], 1) << "the token after the prompt starts the assistant's output";
  for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(d.loss_mask[i], 0) << "prompt token " << i;
  EXPECT_EQ(eval_prompt(d, 1, "chats.h5").size(), size_t(d.sequence_length(1)));
}
#endif
