// Rendered conversation → ids + mask: the whole rendered text is encoded at once (so ids equal the tokenizer's
// on the same string), and a token is in the loss when it starts inside a trained piece.
#include "data/chat_tokenize.h"

#include <chrono>
#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "core/strfmt.h"

namespace df {

TokenData chat_tokenize_stream(std::istream& in, const std::string& name, const BpeTokenizer& tok,
                               const ChatRenderer& chat, int64_t max_len, int64_t total_bytes,
                               TokenizeReport* report) {
  TokenData data;
  data.vocab_size = tok.vocab_size();
  TokenizeReport rep;
  rep.template_source = chat.source();
  const bool prompts = chat.add_generation_prompt();
  using clock = std::chrono::steady_clock;
  auto last_report = clock::now();
  int64_t bytes = 0;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    bytes += int64_t(line.size()) + 1;
    const std::string where = strfmt("%s line %lld", name.c_str(), (long long)line_no);
    DF_CHECK(line.find_first_not_of(" \t\r") != std::string::npos,
             "%s: empty line; every line must be one JSON object (remove blank lines)", where.c_str());
    const std::vector<ChatPiece> pieces = chat.render(chat_parse_line(line, where), where);
    std::string text;
    std::vector<std::pair<int64_t, int64_t>> trained;
    for (const ChatPiece& p : pieces) {
      if (p.trained) trained.emplace_back(int64_t(text.size()), int64_t(text.size() + p.text.size()));
      text += p.text;
    }
    std::vector<TokenSpan> toks;
    try {
      toks = tok.encode(text);
    } catch (const Error& e) {
      DF_FAIL("%s: %s", where.c_str(), e.what());
    }
    DF_CHECK(!toks.empty(), "%s: the record renders to no tokens; drop it", where.c_str());
    if (max_len > 0 && int64_t(toks.size()) > max_len) {
      toks.resize(size_t(max_len));
      ++rep.truncated;
    }
    size_t span = 0;
    int64_t in_loss = 0;
    for (const TokenSpan& t : toks) {
      while (span < trained.size() && trained[span].second <= t.begin) ++span;
      const bool m = span < trained.size() && t.begin >= trained[span].first;
      data.tokens.push_back(t.id);
      if (!prompts) data.loss_mask.push_back(m ? 1 : 0);
      in_loss += m;
    }
    if (in_loss == 0 && !prompts) ++rep.untrained;
    data.offsets.push_back(data.num_tokens());
    if (total_bytes > 0 && (line_no & 255) == 0 && clock::now() - last_report > std::chrono::seconds(5)) {
      last_report = clock::now();
      log_info("tokenize %s: %lld lines, %lld tokens, %.1f%% of the input", name.c_str(), (long long)line_no,
               (long long)data.num_tokens(), 100.0 * double(bytes) / double(total_bytes));
    }
  }
  DF_CHECK(!in.bad(), "%s: read error", name.c_str());
  DF_CHECK(data.num_sequences() > 0, "%s: no records; the file is empty", name.c_str());
  if (report) *report = rep;
  return data;
}

TokenData chat_tokenize_file(const std::string& in_path, const std::string& out_path, const std::string& tokenizer,
                             const TokenizeOptions& opts, TokenizeReport* report) {
  BpeTokenizer tok(tokenizer);
  ChatOptions chat_opts = opts.chat;
  if (!opts.tools_file.empty()) chat_opts.tools = chat_tools_read(opts.tools_file);
  const ChatRenderer chat(opts.chat_template, tokenizer, chat_opts);
  std::ifstream in(in_path, std::ios::binary | std::ios::ate);
  DF_CHECK(in.is_open(), "%s: cannot open the JSONL input (missing or unreadable)", in_path.c_str());
  const int64_t size = int64_t(in.tellg());
  in.seekg(0);
  TokenData data = chat_tokenize_stream(in, in_path, tok, chat, opts.max_len, size, report);
  token_file_write(out_path, data);
  return data;
}

}  // namespace df
