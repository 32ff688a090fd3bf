// libFuzzer target: a Hugging Face config.json (qwen_config_from_json). Any input must give a QwenConfig or a
// df::Error; JSON syntax errors are rejected before, as the loader does.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "model/qwen_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  df_fuzz::expect_clean([&] {
    df::QwenConfig c = df::qwen_config_from_json(j, "fuzz/config.json");
    df::qwen_config_summary(c);
    c.params_non_embedding();
  });
  return 0;
}
