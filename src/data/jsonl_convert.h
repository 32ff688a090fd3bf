// JSONL → token file: one {"input_ids": [...], "loss_mask": [...]} object per line (loss_mask optional,
// absent = all ones), the format SpecForge-style preprocessing emits. Every problem is reported with the
// line number so a bad record in a multi-GB file can be found.
#pragma once
#include <cstdint>
#include <istream>
#include <string>

#include "data/token_file.h"

namespace df {

// Parses `in` (named `name` in messages). `total_bytes` > 0 enables a progress line every few seconds.
TokenData jsonl_parse_tokens(std::istream& in, const std::string& name, int64_t vocab_size, int64_t total_bytes = 0);

// Reads `in_path`, writes `out_path` atomically; returns what was written.
TokenData jsonl_convert_file(const std::string& in_path, const std::string& out_path, int64_t vocab_size);

}  // namespace df
