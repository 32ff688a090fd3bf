// Line-by-line JSONL parsing with nlohmann::json; every check names the file and the 1-based line.
#include "data/jsonl_convert.h"

#include <chrono>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"

namespace df {

namespace {

// Returns whether the record carries a loss_mask (one without is appended as all ones).
bool append_record(TokenData& data, const nlohmann::json& rec, const std::string& where, int64_t vocab) {
  DF_CHECK(rec.is_object(), "%s: expected a JSON object {\"input_ids\": [...]}", where.c_str());
  auto ids = rec.find("input_ids");
  DF_CHECK(ids != rec.end() && ids->is_array(), "%s: missing the array 'input_ids'", where.c_str());
  DF_CHECK(!ids->empty(), "%s: 'input_ids' is empty; drop the record or give it tokens", where.c_str());
  size_t n = ids->size();
  for (size_t i = 0; i < n; ++i) {
    const nlohmann::json& v = (*ids)[i];
    DF_CHECK(v.is_number_integer(), "%s: input_ids[%zu] is not an integer", where.c_str(), i);
    int64_t id = v.get<int64_t>();
    DF_CHECK(id >= 0 && id < vocab, "%s: input_ids[%zu] = %lld is outside the vocabulary [0, %lld); wrong --vocab "
             "or wrong tokenizer?", where.c_str(), i, static_cast<long long>(id), static_cast<long long>(vocab));
    data.tokens.push_back(static_cast<int32_t>(id));
  }
  auto mask = rec.find("loss_mask");
  const bool has_mask = mask != rec.end() && !mask->is_null();
  if (!has_mask) {
    data.loss_mask.insert(data.loss_mask.end(), n, uint8_t{1});
  } else {
    DF_CHECK(mask->is_array(), "%s: 'loss_mask' must be an array of 0/1", where.c_str());
    DF_CHECK(mask->size() == n, "%s: 'loss_mask' has %zu entries but 'input_ids' has %zu; they must match",
             where.c_str(), mask->size(), n);
    for (size_t i = 0; i < n; ++i) {
      const nlohmann::json& v = (*mask)[i];
      int64_t m = v.is_boolean() ? v.get<bool>() : v.is_number_integer() ? v.get<int64_t>() : -1;
      DF_CHECK(m == 0 || m == 1, "%s: loss_mask[%zu] must be 0 or 1 (or true/false)", where.c_str(), i);
      data.loss_mask.push_back(static_cast<uint8_t>(m));
    }
  }
  data.offsets.push_back(data.num_tokens());
  return has_mask;
}

}  // namespace

TokenData jsonl_parse_tokens(std::istream& in, const std::string& name, int64_t vocab_size, int64_t total_bytes,
                             JsonlReport* report) {
  DF_CHECK(vocab_size > 0 && vocab_size <= std::numeric_limits<int32_t>::max(),
           "--vocab %lld must be in [1, 2^31-1] (the tokenizer's vocabulary size)", static_cast<long long>(vocab_size));
  TokenData data;
  data.vocab_size = vocab_size;
  using clock = std::chrono::steady_clock;
  auto last_report = clock::now();
  int64_t bytes = 0, unmasked = 0;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    bytes += static_cast<int64_t>(line.size()) + 1;
    std::string where = strfmt("%s line %lld", name.c_str(), static_cast<long long>(line_no));
    DF_CHECK(line.find_first_not_of(" \t\r") != std::string::npos,
             "%s: empty line; every line must be one JSON object (remove blank lines)", where.c_str());
    nlohmann::json rec;
    try {
      rec = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      DF_FAIL("%s: not valid JSON (%s)", where.c_str(), e.what());
    }
    unmasked += !append_record(data, rec, where, vocab_size);
    if (total_bytes > 0 && (line_no & 1023) == 0 && clock::now() - last_report > std::chrono::seconds(5)) {
      last_report = clock::now();
      log_info("convert %s: %lld lines, %lld tokens, %.1f%% of the input", name.c_str(),
               static_cast<long long>(line_no), static_cast<long long>(data.num_tokens()),
               100.0 * static_cast<double>(bytes) / static_cast<double>(total_bytes));
    }
  }
  DF_CHECK(!in.bad(), "%s: read error", name.c_str());
  DF_CHECK(data.num_sequences() > 0, "%s: no records; the file is empty", name.c_str());
  // No record has a mask: write none, so the file says so (`data info`). Training reads a missing mask as all
  // ones, exactly what was written here before; eval takes each sequence whole as its prompt either way.
  if (unmasked == data.num_sequences()) data.loss_mask.clear();
  if (report) report->unmasked = unmasked;
  return data;
}

TokenData jsonl_convert_file(const std::string& in_path, const std::string& out_path, int64_t vocab_size,
                             JsonlReport* report) {
  std::ifstream in(in_path, std::ios::binary | std::ios::ate);
  DF_CHECK(in.is_open(), "%s: cannot open the JSONL input (missing or unreadable)", in_path.c_str());
  int64_t size = static_cast<int64_t>(in.tellg());
  in.seekg(0);
  TokenData data = jsonl_parse_tokens(in, in_path, vocab_size, size, report);
  token_file_write(out_path, data);
  return data;
}

}  // namespace df
