// libFuzzer target: the rankfile parser (rankfile_parse_text), and the formatter on what it accepts.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "topo/rankfile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  df_fuzz::expect_clean([&] { df::rankfile_format(df::rankfile_parse_text(text, "fuzz.rf")); });
  return 0;
}
