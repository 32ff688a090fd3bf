// Shared by the libFuzzer targets: a per-process scratch folder for parsers that read files, and the rule
// that a parser may reject any input only with a df::Error (anything else escaping is a finding).
#pragma once
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace df_fuzz {

inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string d =
        (std::filesystem::temp_directory_path() / ("df_fuzz_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  return path;
}

// Runs `f`; a df::Error (a clear refusal) is the expected outcome for bad input.
template <class F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const df::Error&) {
  }
}

}  // namespace df_fuzz
