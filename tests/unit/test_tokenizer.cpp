// The C++ byte-level BPE and `data tokenize`: ids equal to Hugging Face `tokenizers` on a tokenizer trained by
// it (tests/golden/make_tokenizer_golden.py), hand-checked merges, added tokens and offsets on a tiny
// tokenizer.json written here, the assistant-only mask of a rendered conversation, prompt files, and the errors.
// The templates themselves: test_jinja, test_chat_template and test_chat_golden.
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

TEST(ChatTokenize, MaskCoversExactlyTheAssistantTokensAndErrorsWriteNothing) {
  ScratchDir dir("tok_chat");
  const std::string tj = tiny_tokenizer(dir);
  BpeTokenizer tok(tj);
  const std::string tmpl = (dir.path / "chatml.jinja").string();
  std::ofstream(tmpl) << "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
                         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  const ChatRenderer chat(tmpl, tj, {});
  std::istringstream in(
      R"({"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hello world"}]})"
      "\n"
      R"({"text": "hello"})"
      "\n");
  TokenizeReport rep;
  TokenData d = chat_tokenize_stream(in, "mem", tok, chat, 0, 0, &rep);
  ASSERT_EQ(d.num_sequences(), 2);
  // The first sequence's text rendered and tokenized whole; the loss covers the assistant body through the
  // <|im_end|>\n that closes it (SpecForge's span), not its header.
  const std::string text = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhello world<|im_end|>\n";
  std::vector<TokenSpan> t = tok.encode(text);
  ASSERT_EQ(d.sequence_length(0), int64_t(t.size()));
  const size_t body = text.find("hello world");
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(d.tokens[i], t[i].id);
    EXPECT_EQ(d.loss_mask[i], size_t(t[i].begin) >= body ? 1 : 0) << "token " << i << " at byte " << t[i].begin;
  }
  for (int64_t i = d.offsets[1]; i < d.offsets[2]; ++i) EXPECT_EQ(d.loss_mask[size_t(i)], 1);  // plain text
  EXPECT_EQ(rep.truncated, 0);
  EXPECT_EQ(rep.template_source, tmpl);

  // A prompt file (add_generation_prompt): the assistant header ends each sequence, and no loss_mask is written.
  ChatOptions prompt;
  prompt.add_generation_prompt = true;
  std::istringstream q(R"({"messages": [{"role": "user", "content": "hello"}]})");
  TokenData p = chat_tokenize_stream(q, "mem", tok, ChatRenderer(tmpl, tj, prompt), 0, 0, nullptr);
  EXPECT_EQ(p.tokens, tok.encode_ids("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_TRUE(p.loss_mask.empty());

  // A malformed second line: the error names it, and the output file is never created.
  const fs::path in_path = dir.path / "chats.jsonl", out = dir.path / "out.h5";
  std::ofstream(in_path) << R"({"text": "ok"})" << "\n" << R"({"messages": 5})" << "\n";
  TokenizeOptions o;
  o.chat_template = tmpl;
  try {
    chat_tokenize_file(in_path.string(), out.string(), tj, o, nullptr);
    FAIL() << "a malformed line was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chats.jsonl line 2"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out));

  std::istringstream longer(R"({"text": "hello hello hello hello"})");
  TokenData cut = chat_tokenize_stream(longer, "mem", tok, chat, 3, 0, &rep);
  EXPECT_EQ(cut.num_tokens(), 3);
  EXPECT_EQ(rep.truncated, 1);
}

}  // namespace
}  // namespace df

#else
TEST(Tokenizer, NotBuilt) { GTEST_SKIP() << "built without PCRE2/libunistring: the tokenizer is not in this build"; }
#endif
