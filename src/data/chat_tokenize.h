// `data tokenize`: conversation JSONL → HDF5 token file with an assistant-only loss mask, through the target's
// own tokenizer.json (data/tokenizer.h) and chat template (data/chat_template.h). Built when PCRE2 and
// libunistring are (DF_HAVE_TOKENIZER).
#pragma once
#include <cstdint>
#include <istream>
#include <string>

#include "data/chat_template.h"
#include "data/token_file.h"
#include "data/tokenizer.h"

namespace df {

struct TokenizeOptions {
  ChatOptions chat;
  int64_t max_len = 0;  // > 0: sequences longer than this are cut to it (counted in the report)
};

struct TokenizeReport {
  int64_t truncated = 0;   // sequences cut to max_len
  int64_t untrained = 0;   // sequences with no token in the loss (no assistant turn)
};

// Every line is one record (chat_parse_line); an error names `name`, the 1-based line and the field.
TokenData chat_tokenize_stream(std::istream& in, const std::string& name, const BpeTokenizer& tok,
                               const TokenizeOptions& opts, int64_t total_bytes, TokenizeReport* report);

// Reads `in_path` whole before writing `out_path` atomically: a malformed line leaves no output.
TokenData chat_tokenize_file(const std::string& in_path, const std::string& out_path, const std::string& tokenizer,
                             const TokenizeOptions& opts, TokenizeReport* report);

}  // namespace df
