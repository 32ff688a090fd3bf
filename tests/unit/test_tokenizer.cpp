// The C++ byte-level BPE and the chat template: ids equal to Hugging Face `tokenizers` on a tokenizer trained by
// it (tests/golden/make_tokenizer_golden.py), hand-checked merges, added tokens and offsets on a tiny
// tokenizer.json written here, the Qwen template's exact text, the assistant-only mask, and the errors.
#include <gtest/gtest.h>

#ifdef DF_HAVE_TOKENIZER
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/chat_tokenize.h"
#include "golden_util.h"

namespace df {
namespace {

using json = nlohmann::json;
using golden::ScratchDir;
namespace fs = std::filesystem;

// GPT-2's byte alphabet as UTF-8 strings (what a ByteLevel vocabulary holds for each byte).
std::string byte_char(int b) {
  int cp = b;
  if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// A tiny tokenizer.json: the 256 byte characters (ids 0..255 in byte order), merges "h e", "l l", "he ll",
// "hell o", "Ġ w" (Ġ = the space byte), an added special token and an added plain one, Qwen2's split regex.
std::string tiny_tokenizer(const ScratchDir& dir, const json& normalizer = json{{"type", "NFC"}}) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::string sp = byte_char(' ');
  std::vector<std::pair<std::string, std::string>> merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"},
                                                             {sp, "w"}};
  json jm = json::array();
  int id = 256;
  for (auto& [a, b] : merges) {
    vocab[a + b] = id++;
    jm.push_back(a + " " + b);
  }
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::array({json{{"id", 300}, {"content", "<|im_end|>"}, {"special", true}},
                                   json{{"id", 301}, {"content", "<think>"}, {"special", false}}});
  j["normalizer"] = normalizer;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({json{{"type", "Split"},
                         {"pattern", {{"Regex", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                                "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                         {"behavior", "Isolated"},
                         {"invert", false}},
                    json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", jm}, {"ignore_merges", false}};
  const std::string path = (dir.path / "tokenizer.json").string();
  std::ofstream(path) << j.dump();
  return path;
}

TEST(Tokenizer, MergesByRankAddedTokensAndOffsets) {
  ScratchDir dir("tok_tiny");
  BpeTokenizer tok(tiny_tokenizer(dir));
  EXPECT_EQ(tok.vocab_size(), 302);
  // "hello": h e → he, l l → ll, he ll → hell, hell o → hello (id 259). " world": Ġ w merges, rest bytes.
  std::vector<TokenSpan> t = tok.encode("hello world<|im_end|>x<think>");
  std::vector<int32_t> ids;
  for (auto& s : t) ids.push_back(s.id);
  const std::vector<int32_t> want = {259, 260, 'o', 'r', 'l', 'd', 300, 'x', 301};
  EXPECT_EQ(ids, want);
  EXPECT_EQ(t[0].begin, 0);
  EXPECT_EQ(t[0].end, 5);
  EXPECT_EQ(t[1].begin, 5);  // " w"
  EXPECT_EQ(t[1].end, 7);
  EXPECT_EQ(t[6].begin, 11);  // <|im_end|>
  EXPECT_EQ(t[6].end, 21);
  EXPECT_EQ(t[8].begin, 22);
  // A pair whose rank is lower wins even when it sits to the right: "ell" has no "e l" merge, only "l l".
  EXPECT_EQ(tok.encode_ids("ell"), (std::vector<int32_t>{'e', 257}));
  EXPECT_EQ(tok.token_id("<think>"), 301);
  EXPECT_EQ(tok.token_id("nope"), -1);
}

TEST(Tokenizer, NfcComposesBeforeSplittingAndKeepsOffsetsOfUnchangedText) {
  ScratchDir dir("tok_nfc");
  BpeTokenizer tok(tiny_tokenizer(dir));
  const std::string composed = "caf\xC3\xA9 ok", decomposed = "cafe\xCC\x81 ok";
  EXPECT_EQ(tok.encode_ids(composed), tok.encode_ids(decomposed));
  std::vector<TokenSpan> t = tok.encode(decomposed);
  EXPECT_EQ(t.back().end, int64_t(decomposed.size()));  // " ok" sits after the rewritten run, offsets exact
  EXPECT_EQ(t.back().begin, int64_t(decomposed.size()) - 1);
  ScratchDir raw("tok_raw");
  BpeTokenizer plain(tiny_tokenizer(raw, json()));  // normalizer null: no composition
  EXPECT_NE(plain.encode_ids(composed), plain.encode_ids(decomposed));
}

TEST(Tokenizer, RefusesWhatItDoesNotImplementAndInvalidUtf8) {
  ScratchDir dir("tok_bad");
  try {
    BpeTokenizer tok(tiny_tokenizer(dir, json{{"type", "NFKC"}}));
    FAIL() << "an NFKC normalizer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("normalizer.type 'NFKC'"), std::string::npos) << e.what();
  }
  BpeTokenizer tok(tiny_tokenizer(dir));
  try {
    tok.encode("ok \xFF bad");
    FAIL() << "invalid UTF-8 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("byte 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(BpeTokenizer((dir.path / "missing").string()), Error);
}

// Ids written by Hugging Face `tokenizers` itself (make_tokenizer_golden.py, on the GPU machine).
TEST(Tokenizer, EqualsHuggingFaceTokenizersOnTheGoldenCases) {
  const std::string dir = std::string(DF_SOURCE_DIR) + "/tests/golden/tokenizer";
  std::ifstream f(dir + "/golden.json");
  ASSERT_TRUE(f.is_open()) << dir << "/golden.json missing: run tests/golden/make_tokenizer_golden.py";
  const json g = json::parse(f);
  BpeTokenizer tok(dir);
  ASSERT_GE(g["cases"].size(), 20u);
  for (const json& c : g["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tok.encode_ids(text), c["ids"].get<std::vector<int32_t>>()) << "text: " << text;
  }
}

TEST(ChatTemplate, QwenTurnsToolsThinkingAndTheTrainedSpans) {
  const std::string line =
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},)"
      R"( {"role": "assistant", "content": "<think>\nCall the tool.\n</think>\n\nCalling."},)"
      R"( {"role": "tool", "content": "21C"}, {"role": "tool", "content": "sunny"},)"
      R"( {"role": "assistant", "content": "21C, sunny.", "reasoning_content": "Both results."}]})";
  std::vector<ChatTurn> turns = chat_parse_line(line, "t line 1");
  ASSERT_EQ(turns.size(), 6u);
  EXPECT_EQ(turns[2].reasoning, "Call the tool.");
  EXPECT_EQ(turns[2].content, "Calling.");
  std::string text, trained;
  for (const ChatPiece& p : chat_render(turns, {})) {
    text += p.text;
    if (p.trained) trained += p.text + "|";
  }
  EXPECT_EQ(text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nCall the tool.\n</think>\n\nCalling.<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n21C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\n<think>\nBoth results.\n</think>\n\n21C, sunny.<|im_end|>\n");
  EXPECT_EQ(trained, "<think>\nCall the tool.\n</think>\n\nCalling.<|im_end|>|"
                     "<think>\nBoth results.\n</think>\n\n21C, sunny.<|im_end|>|");
  ChatOptions off;
  off.thinking = false;
  std::string body;
  for (const ChatPiece& p : chat_render(turns, off))
    if (p.trained) body += p.text + "|";
  EXPECT_EQ(body, "<think>\n\n</think>\n\nCalling.<|im_end|>|<think>\n\n</think>\n\n21C, sunny.<|im_end|>|");
  ChatOptions none;
  none.kind = ChatTemplateKind::none;
  std::vector<ChatPiece> plain = chat_render(chat_parse_line(
      R"({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]})", "t"), none);
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(plain[0].text, "Q");
  EXPECT_FALSE(plain[0].trained);
  EXPECT_EQ(plain[1].text, "A");
  EXPECT_TRUE(plain[1].trained);
}

TEST(ChatTemplate, MalformedLinesNameTheLineAndTheField) {
  auto msg = [](const std::string& line) {
    try {
      chat_parse_line(line, "chats.jsonl line 7");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg("{not json").find("chats.jsonl line 7: not valid JSON"), std::string::npos);
  EXPECT_NE(msg(R"({"messages": []})").find("non-empty array 'messages'"), std::string::npos);
  EXPECT_NE(msg(R"({"messages": [{"role": "wizard", "content": "x"}]})").find("messages[0]: unknown role 'wizard'"),
            std::string::npos);
  EXPECT_NE(msg(R"({"messages": [{"role": "user"}]})").find("messages[0]: needs 'content'"), std::string::npos);
  EXPECT_NE(msg(R"({"messages": [{"role": "user", "content": [{"type": "image"}]}]})").find("content[0] is not a text"),
            std::string::npos);
}

TEST(ChatTokenize, MaskCoversExactlyTheAssistantTokensAndErrorsWriteNothing) {
  ScratchDir dir("tok_chat");
  const std::string tj = tiny_tokenizer(dir);
  BpeTokenizer tok(tj);
  std::istringstream in(
      R"({"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hello world"}]})"
      "\n"
      R"({"text": "hello"})"
      "\n");
  TokenizeOptions o;
  o.chat.thinking = false;
  TokenizeReport rep;
  TokenData d = chat_tokenize_stream(in, "mem", tok, o, 0, &rep);
  ASSERT_EQ(d.num_sequences(), 2);
  // The first sequence's text rendered and tokenized whole; masked tokens are those of the assistant body.
  std::string text = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nhello "
                     "world<|im_end|>\n";
  std::vector<TokenSpan> t = tok.encode(text);
  ASSERT_EQ(d.sequence_length(0), int64_t(t.size()));
  const size_t body = text.find("<think>");
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(d.tokens[i], t[i].id);
    const bool want = size_t(t[i].begin) >= body && size_t(t[i].begin) < text.size() - 1;  // not the final "\n"
    EXPECT_EQ(d.loss_mask[i], want ? 1 : 0) << "token " << i << " at byte " << t[i].begin;
  }
  for (int64_t i = d.offsets[1]; i < d.offsets[2]; ++i) EXPECT_EQ(d.loss_mask[size_t(i)], 1);  // plain text
  EXPECT_EQ(rep.truncated, 0);

  // A malformed second line: the error names it, and the output file is never created.
  const fs::path in_path = dir.path / "chats.jsonl", out = dir.path / "out.h5";
  std::ofstream(in_path) << R"({"text": "ok"})" << "\n" << R"({"messages": 5})" << "\n";
  try {
    chat_tokenize_file(in_path.string(), out.string(), tj, o, nullptr);
    FAIL() << "a malformed line was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chats.jsonl line 2"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out));

  std::istringstream longer(R"({"text": "hello hello hello hello"})");
  o.max_len = 3;
  TokenData cut = chat_tokenize_stream(longer, "mem", tok, o, 0, &rep);
  EXPECT_EQ(cut.num_tokens(), 3);
  EXPECT_EQ(rep.truncated, 1);
}

}  // namespace
}  // namespace df

#else
TEST(Tokenizer, NotBuilt) { GTEST_SKIP() << "built without PCRE2/libunistring: the tokenizer is not in this build"; }
#endif
