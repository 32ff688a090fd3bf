// Parsing of the conversation formats and the Qwen chat template. The template follows Qwen3's: tool results
// (consecutive ones merged) are a user turn of <tool_response> blocks; an assistant turn's reasoning, given
// separately or inline as a leading <think>…</think>, is rendered in a <think> block.
#include "data/chat_template.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace df {

namespace {

using json = nlohmann::json;

std::string content_text(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return "";
  DF_CHECK(c.is_array(), "%s: 'content' must be a string or a list of {\"type\": \"text\", \"text\": ...} parts",
           where.c_str());
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& p = c[i];
    DF_CHECK(p.is_object() && p.value("type", "") == "text" && p.contains("text") && p["text"].is_string(),
             "%s: content[%zu] is not a text part (only {\"type\": \"text\", \"text\": ...} is supported)",
             where.c_str(), i);
    out += p["text"].get<std::string>();
  }
  return out;
}

std::string canonical_role(const std::string& r, const std::string& where) {
  if (r == "system" || r == "developer") return "system";
  if (r == "user" || r == "human") return "user";
  if (r == "assistant" || r == "gpt" || r == "model") return "assistant";
  if (r == "tool" || r == "function" || r == "observation") return "tool";
  DF_FAIL("%s: unknown role '%s' (system, user, assistant, tool; ShareGPT human, gpt)", where.c_str(), r.c_str());
}

// Qwen3 splits a leading "<think>…</think>" out of an assistant message that has no separate reasoning.
void split_inline_thinking(ChatTurn& t) {
  if (!t.reasoning.empty()) return;
  const size_t open = t.content.find("<think>"), close = t.content.find("</think>");
  if (open == std::string::npos || close == std::string::npos || close < open) return;
  if (t.content.find_first_not_of(" \t\r\n") != open) return;
  auto trim = [](std::string s) {
    const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  t.reasoning = trim(t.content.substr(open + 7, close - open - 7));
  t.content = trim(t.content.substr(close + 8));
}

}  // namespace

std::vector<ChatTurn> chat_parse_line(const std::string& line, const std::string& where) {
  json rec;
  try {
    rec = json::parse(line);
  } catch (const json::parse_error& e) {
    DF_FAIL("%s: not valid JSON (%s)", where.c_str(), e.what());
  }
  DF_CHECK(rec.is_object(), "%s: expected a JSON object with 'messages', 'conversations' or 'text'", where.c_str());
  std::vector<ChatTurn> turns;
  if (rec.contains("text") && !rec.contains("messages") && !rec.contains("conversations")) {
    DF_CHECK(rec["text"].is_string(), "%s: 'text' must be a string", where.c_str());
    turns.push_back({"text", rec["text"].get<std::string>(), ""});
    return turns;
  }
  const char* key = rec.contains("messages") ? "messages" : "conversations";
  DF_CHECK(rec.contains(key) && rec[key].is_array() && !rec[key].empty(),
           "%s: needs a non-empty array 'messages' (OpenAI) or 'conversations' (ShareGPT), or a string 'text'",
           where.c_str());
  const json& msgs = rec[key];
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string at = where + ": " + key + "[" + std::to_string(i) + "]";
    const json& m = msgs[i];
    DF_CHECK(m.is_object(), "%s: must be an object", at.c_str());
    const char* rk = m.contains("role") ? "role" : "from";
    const char* ck = m.contains("content") ? "content" : "value";
    DF_CHECK(m.contains(rk) && m[rk].is_string(), "%s: needs a string 'role' (or ShareGPT 'from')", at.c_str());
    DF_CHECK(m.contains(ck), "%s: needs 'content' (or ShareGPT 'value')", at.c_str());
    ChatTurn t;
    t.role = canonical_role(m[rk].get<std::string>(), at);
    t.content = content_text(m[ck], at + "." + ck);
    for (const char* r : {"reasoning_content", "thinking", "reasoning"})
      if (m.contains(r) && m[r].is_string()) t.reasoning = m[r].get<std::string>();
    if (t.role == "assistant") split_inline_thinking(t);
    turns.push_back(std::move(t));
  }
  return turns;
}

ChatTemplateKind chat_template_parse(const std::string& name) {
  if (name == "qwen") return ChatTemplateKind::qwen;
  if (name == "none") return ChatTemplateKind::none;
  DF_FAIL("--chat-template '%s' is not known: qwen (<|im_start|>role ... <|im_end|>) or none (contents only)",
          name.c_str());
}

std::vector<ChatPiece> chat_render(const std::vector<ChatTurn>& turns, const ChatOptions& opts) {
  std::vector<ChatPiece> out;
  auto body = [&](const ChatTurn& t) {
    if (!opts.thinking) return "<think>\n\n</think>\n\n" + t.content;
    if (t.reasoning.empty()) return t.content;
    return "<think>\n" + t.reasoning + "\n</think>\n\n" + t.content;
  };
  for (size_t i = 0; i < turns.size(); ++i) {
    const ChatTurn& t = turns[i];
    if (t.role == "text") {
      out.push_back({t.content, true});
      continue;
    }
    if (opts.kind == ChatTemplateKind::none) {
      out.push_back({t.role == "assistant" ? body(t) : t.content, t.role == "assistant"});
      continue;
    }
    if (t.role == "assistant") {
      out.push_back({"<|im_start|>assistant\n", false});
      out.push_back({body(t) + "<|im_end|>", true});
      out.push_back({"\n", false});
    } else if (t.role == "tool") {
      std::string s = "<|im_start|>user";
      for (; i < turns.size() && turns[i].role == "tool"; ++i)
        s += "\n<tool_response>\n" + turns[i].content + "\n</tool_response>";
      --i;
      out.push_back({s + "<|im_end|>\n", false});
    } else {
      out.push_back({"<|im_start|>" + t.role + "\n" + t.content + "<|im_end|>\n", false});
    }
  }
  return out;
}

}  // namespace df
