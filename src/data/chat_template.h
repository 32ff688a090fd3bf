// Conversations as users bring them (OpenAI `messages` or ShareGPT `conversations` JSONL, or plain `text`)
// rendered to the text the target model sees, with the spans the drafter is trained on. The text comes from the
// chat template the model ships (`chat_template.jinja`, or `chat_template` in tokenizer_config.json) run by the
// Jinja interpreter of data/jinja.h, so it equals Hugging Face's `apply_chat_template`; `none` renders the
// contents alone.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "data/jinja.h"

namespace df {

// One JSONL line. `messages` are passed to the template as they are in an OpenAI record (every key kept); a
// ShareGPT record's {"from", "value"} become {"role", "content"} (human → user, gpt → assistant, ...).
struct ChatRecord {
  bool plain = false;  // a {"text": ...} record: trained whole, no template
  std::string text;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // the record's own "tools", null when it has none
};

// Throws naming `where` (file and line) and the field at fault.
ChatRecord chat_parse_line(const std::string& line, const std::string& where);

// A `--tools` file: a JSON array of tool schemas ({"type": "function", "function": {...}}).
nlohmann::ordered_json chat_tools_read(const std::string& path);

struct ChatOptions {
  std::optional<bool> enable_thinking;  // unset: the template's own default (the variable stays undefined)
  bool add_generation_prompt = false;   // prompt files: end with the assistant header the model continues from
  nlohmann::ordered_json tools;         // for records without their own "tools" (null: none)
  // More top-level template variables, as apply_chat_template's keyword arguments (e.g. Qwen3.6's
  // preserve_thinking); each must be one the template reads (chat_template_var_add fills it).
  nlohmann::ordered_json template_vars = nlohmann::ordered_json::object();
};

// Adds one `--template-var KEY=VALUE` to `vars`: VALUE is read as JSON (true, 3, "text", [...]) and, when it
// is not JSON, taken as a string. Throws for a KEY that is not a name, one given twice, one with its own
// option (messages, tools, documents, add_generation_prompt, enable_thinking) and Python's True/False/None.
void chat_template_var_add(nlohmann::ordered_json& vars, const std::string& arg);

// A rendered span of text; `trained` spans are what the assistant produced in a turn (see chat_render).
struct ChatPiece {
  std::string text;
  bool trained = false;
};

class ChatRenderer {
 public:
  // `spec`: "auto" (the template `tokenizer` ships: chat_template.jinja beside its tokenizer.json, else
  // tokenizer_config.json's chat_template), "none" (contents only) or the path of a .jinja file. Throws
  // naming the file for a template that is missing or that the interpreter cannot run, and for a template
  // variable the template never reads.
  ChatRenderer(const std::string& spec, const std::string& tokenizer, ChatOptions opts);

  // The loss spans follow SpecForge's GeneralParser for ChatML: everything after each "<|im_start|>assistant\n"
  // up to and including the next "<|im_end|>\n" (or the end of the text), i.e. the assistant's think block,
  // answer, tool calls and end-of-turn token, as the template rendered them. With `none` the assistant
  // contents are trained. A plain-text record is trained whole. Throws naming `where` and the template line.
  std::vector<ChatPiece> render(const ChatRecord& rec, const std::string& where) const;

  const std::string& source() const { return source_; }  // where the template came from, for the log
  bool add_generation_prompt() const { return opts_.add_generation_prompt; }

 private:
  std::unique_ptr<jinja::Template> template_;  // null: none
  nlohmann::ordered_json special_tokens_;      // bos_token, eos_token, ... from tokenizer_config.json
  ChatOptions opts_;
  std::string source_;
};

}  // namespace df
