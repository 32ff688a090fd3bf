// libFuzzer target: the TOML run config (config_parse). Any input must parse or fail with a df::Error.
#include <cstddef>
#include <cstdint>

#include "core/config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  df_fuzz::expect_clean([&] { df::config_table(df::config_parse(text, "fuzz.toml")); });
  return 0;
}
