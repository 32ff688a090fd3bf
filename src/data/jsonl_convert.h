// JSONL → token file: one {"input_ids": [...], "loss_mask": [...]} object per line, the format SpecForge-style
// preprocessing emits. loss_mask is optional: when no record has one the file gets none (a file of prompts, or
// text trained whole), else a record without one is written as all ones. Every problem is reported with the
// line number so a bad record in a multi-GB file can be found.
#pragma once
#include <cstdint>
#include <istream>
#include <string>

#include "data/token_file.h"

namespace df {

struct JsonlReport {
  int64_t unmasked = 0;  // records without a loss_mask (all of them: the file has no mask)
};

// Parses `in` (named `name` in messages). `total_bytes` > 0 enables a progress line every few seconds.
TokenData jsonl_parse_tokens(std::istream& in, const std::string& name, int64_t vocab_size, int64_t total_bytes = 0,
                             JsonlReport* report = nullptr);

// Reads `in_path`, writes `out_path` atomically; returns what was written.
TokenData jsonl_convert_file(const std::string& in_path, const std::string& out_path, int64_t vocab_size,
                             JsonlReport* report = nullptr);

}  // namespace df
