// A byte-level BPE tokenizer that reads a Hugging Face `tokenizer.json` (the format of every Qwen2/Qwen3/Qwen3.5
// checkpoint): added tokens matched first, the NFC normalizer, the Split pre-tokenizer regex (PCRE2, Unicode
// properties), the ByteLevel byte→character map and the BPE merges. Token ids equal Hugging Face `tokenizers`'
// for these settings (tests/unit/test_tokenizer.cpp holds ids that library wrote).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace df {

// One token of an encoding and the bytes [begin, end) of the input text it came from. A token made from
// bytes that NFC normalisation changed spans the normalised piece's original extent.
struct TokenSpan {
  int32_t id = 0;
  int64_t begin = 0, end = 0;
};

class BpeTokenizer {
 public:
  // Reads `<dir>/tokenizer.json` (or `dir` itself when it names a file). Throws naming the file and the JSON
  // field for anything this tokenizer does not implement (another model type, a normalizer other than NFC,
  // added tokens with lstrip/rstrip, ...), so an unsupported tokenizer never encodes silently wrong.
  explicit BpeTokenizer(const std::string& dir);
  ~BpeTokenizer();
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  // Encodes UTF-8 text (invalid UTF-8 is an error naming the byte offset) as Hugging Face's
  // `tokenizer.encode(text, add_special_tokens=False)`: added tokens inside the text become their ids.
  std::vector<TokenSpan> encode(const std::string& text) const;
  std::vector<int32_t> encode_ids(const std::string& text) const;

  // The id of an added or vocabulary token, or −1.
  int32_t token_id(const std::string& token) const;
  // One more than the largest id (vocabulary and added tokens).
  int64_t vocab_size() const;
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace df
