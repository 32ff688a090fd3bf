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
  std::string chat_template = "auto";  // auto (the model's) | none | a .jinja file (ChatRenderer)
  ChatOptions chat;
  std::string tools_file;              // --tools: default tools for records without their own
  int64_t max_len = 0;                 // > 0: sequences longer than this are cut to it (counted in the report)
};

struct TokenizeReport {
  int64_t truncated = 0;   // sequences cut to max_len
  int64_t untrained = 0;   // sequences with no token in the loss (no assistant turn)
  std::string template_source;  // where the chat template came from
};

// Every line is one record (chat_parse_line); an error names `name`, the 1-based line and the field or template
// line. With opts.chat.add_generation_prompt (a prompt file) no loss_mask is written: eval takes each sequence
// whole as its prompt.
TokenData chat_tokenize_stream(std::istream& in, const std::string& name, const BpeTokenizer& tok,
                               const ChatRenderer& chat, int64_t max_len, int64_t total_bytes,
                               TokenizeReport* report);

// Reads `in_path` whole before writing `out_path` atomically: a malformed line leaves no output.
TokenData chat_tokenize_file(const std::string& in_path, const std::string& out_path, const std::string& tokenizer,
                             const TokenizeOptions& opts, TokenizeReport* report);

}  // namespace df
