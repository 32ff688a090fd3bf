// Conversations as users bring them (OpenAI `messages` or ShareGPT `conversations` JSONL, or plain `text`)
// rendered to the text the target model sees, with the spans the drafter is trained on: the Qwen chat template
// (`<|im_start|>role\n…<|im_end|>\n`, tool results as `<tool_response>` user turns, `<think>` blocks) or none.
#pragma once
#include <string>
#include <vector>

namespace df {

struct ChatTurn {
  std::string role;       // system | user | assistant | tool | text (a plain-text record)
  std::string content;
  std::string reasoning;  // assistant thinking (reasoning_content / thinking), without the <think> tags
};

enum class ChatTemplateKind { qwen, none };

struct ChatOptions {
  ChatTemplateKind kind = ChatTemplateKind::qwen;
  bool thinking = true;  // on: reasoning in a <think> block; off: an empty block, as Qwen3 emits with thinking off
};

// A rendered span of text; `trained` spans are the assistant's output (its body and <|im_end|>) or a plain text.
struct ChatPiece {
  std::string text;
  bool trained = false;
};

// One JSONL line: {"messages": [{"role", "content", "reasoning_content"?}]}, {"conversations": [{"from",
// "value"} or {"role", "content"}]} or {"text": "..."}. Content may be a string or a list of {"type": "text",
// "text"} parts. Throws naming `where` (file and line) and the field at fault.
std::vector<ChatTurn> chat_parse_line(const std::string& line, const std::string& where);

ChatTemplateKind chat_template_parse(const std::string& name);  // "qwen" | "none", else an error naming both
std::vector<ChatPiece> chat_render(const std::vector<ChatTurn>& turns, const ChatOptions& opts);

}  // namespace df
