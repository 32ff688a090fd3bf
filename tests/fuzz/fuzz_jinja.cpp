// libFuzzer target: chat templates (data/jinja.h). Any input must parse and render with a conversation (tools,
// tool calls, reasoning, unicode) or fail with a df::Error; the interpreter's bounds (nesting, steps, sizes)
// keep a hostile template from running or allocating without end.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "data/jinja.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in 東京? 😀"},
      {"role": "assistant", "content": "<think>\nCall it.\n</think>\n\nChecking.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Tokyo", "days": 2}}}]},
      {"role": "tool", "content": "{\"temp\": 21.5}"},
      {"role": "assistant", "content": "21.5°C.", "reasoning_content": "From the tool."}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "documents": null, "add_generation_prompt": true, "enable_thinking": false, "eos_token": "<|im_end|>"})");
  const std::string source(reinterpret_cast<const char*>(data), size);
  df_fuzz::expect_clean([&] { df::jinja::Template(source, "fuzz.jinja").render(context); });
  return 0;
}
