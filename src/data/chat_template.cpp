// Conversation records, the template a model ships and the loss spans of a rendering (data/chat_template.h).
#include "data/chat_template.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace df {

namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

const std::string kAssistantHeader = "<|im_start|>assistant\n";
const std::string kEndOfTurn = "<|im_end|>\n";

std::string sharegpt_role(const std::string& r, const std::string& where) {
  if (r == "system") return "system";
  if (r == "human" || r == "user") return "user";
  if (r == "gpt" || r == "assistant" || r == "model") return "assistant";
  if (r == "tool" || r == "function" || r == "observation") return "tool";
  DF_FAIL("%s: unknown ShareGPT role '%s' (system, human, gpt, tool)", where.c_str(), r.c_str());
}

// A content is a string, null, or a list of {"type": "text", "text": ...} parts: `data tokenize` trains on text.
void check_content(const json& c, const std::string& where) {
  if (c.is_string() || c.is_null()) return;
  DF_CHECK(c.is_array(), "%s: 'content' must be a string, null or a list of {\"type\": \"text\", \"text\": ...} parts",
           where.c_str());
  for (size_t i = 0; i < c.size(); ++i) {
    const json& p = c[i];
    DF_CHECK(p.is_object() && p.value("type", "") == "text" && p.contains("text") && p["text"].is_string(),
             "%s: content[%zu] is not a text part (only {\"type\": \"text\", \"text\": ...} is supported)",
             where.c_str(), i);
  }
}

std::string content_text(const json& c) {
  if (c.is_string()) return c.get<std::string>();
  std::string out;
  if (c.is_array())
    for (const json& p : c) out += p["text"].get<std::string>();
  return out;
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  DF_CHECK(f.is_open(), "%s: cannot open the %s (missing or unreadable)", path.c_str(), what);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

json read_json(const std::string& path, const char* what) {
  try {
    return json::parse(read_file(path, what));
  } catch (const json::parse_error& e) {
    DF_FAIL("%s: the %s is not valid JSON (%s)", path.c_str(), what, e.what());
  }
}

// transformers passes the tokenizer's named special tokens to the template (bos_token, eos_token, ...).
json special_tokens(const json& config) {
  json out = json::object();
  for (const char* k : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (!config.contains(k)) continue;
    const json& t = config[k];
    if (t.is_string()) out[k] = t;
    else if (t.is_object() && t.contains("content") && t["content"].is_string()) out[k] = t["content"];
  }
  return out;
}

}  // namespace

ChatRecord chat_parse_line(const std::string& line, const std::string& where) {
  json rec;
  try {
    rec = json::parse(line);
  } catch (const json::parse_error& e) {
    DF_FAIL("%s: not valid JSON (%s)", where.c_str(), e.what());
  }
  DF_CHECK(rec.is_object(), "%s: expected a JSON object with 'messages', 'conversations' or 'text'", where.c_str());
  ChatRecord out;
  if (rec.contains("text") && !rec.contains("messages") && !rec.contains("conversations")) {
    DF_CHECK(rec["text"].is_string(), "%s: 'text' must be a string", where.c_str());
    out.plain = true;
    out.text = rec["text"].get<std::string>();
    return out;
  }
  const bool sharegpt = !rec.contains("messages");
  const char* key = sharegpt ? "conversations" : "messages";
  DF_CHECK(rec.contains(key) && rec[key].is_array() && !rec[key].empty(),
           "%s: needs a non-empty array 'messages' (OpenAI) or 'conversations' (ShareGPT), or a string 'text'",
           where.c_str());
  if (rec.contains("tools")) {
    DF_CHECK(rec["tools"].is_array() || rec["tools"].is_null(), "%s: 'tools' must be an array of tool schemas",
             where.c_str());
    out.tools = rec["tools"];
  }
  const json& msgs = rec[key];
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string at = where + ": " + key + "[" + std::to_string(i) + "]";
    json m = msgs[i];
    DF_CHECK(m.is_object(), "%s: must be an object", at.c_str());
    if (!m.contains("role") && m.contains("from")) {  // ShareGPT turn
      DF_CHECK(m["from"].is_string(), "%s: 'from' must be a string", at.c_str());
      DF_CHECK(m.contains("value"), "%s: needs 'value' (ShareGPT) or 'content'", at.c_str());
      json turn = {{"role", sharegpt_role(m["from"].get<std::string>(), at)}, {"content", m["value"]}};
      for (auto it = m.begin(); it != m.end(); ++it)
        if (it.key() != "from" && it.key() != "value") turn[it.key()] = it.value();
      m = std::move(turn);
    }
    DF_CHECK(m.contains("role") && m["role"].is_string(), "%s: needs a string 'role' (or ShareGPT 'from')",
             at.c_str());
    DF_CHECK(m.contains("content"), "%s: needs 'content' (or ShareGPT 'value')", at.c_str());
    check_content(m["content"], at + ".content");
    out.messages.push_back(std::move(m));
  }
  return out;
}

json chat_tools_read(const std::string& path) {
  json t = read_json(path, "--tools file");
  DF_CHECK(t.is_array(), "%s: the --tools file must hold a JSON array of tool schemas", path.c_str());
  for (size_t i = 0; i < t.size(); ++i)
    DF_CHECK(t[i].is_object(), "%s: tool [%zu] is not an object ({\"type\": \"function\", \"function\": {...}})",
             path.c_str(), i);
  return t;
}

void chat_template_var_add(json& vars, const std::string& arg) {
  const size_t eq = arg.find('=');
  DF_CHECK(eq != std::string::npos, "--template-var '%s': expected KEY=VALUE, e.g. preserve_thinking=true",
           arg.c_str());
  const std::string key = arg.substr(0, eq), text = arg.substr(eq + 1);
  bool name = !key.empty() && !std::isdigit(static_cast<unsigned char>(key[0]));
  for (char c : key) name = name && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  DF_CHECK(name, "--template-var '%s': '%s' is not a variable name (letters, digits and _)", arg.c_str(),
           key.c_str());
  for (const char* own : {"messages", "tools", "documents", "add_generation_prompt", "enable_thinking"})
    DF_CHECK(key != own,
             "--template-var '%s': %s has its own option (the records, --tools, "
             "--add-generation-prompt, --enable-thinking)",
             arg.c_str(), key.c_str());
  DF_CHECK(!vars.contains(key), "--template-var '%s': %s is given twice", arg.c_str(), key.c_str());
  DF_CHECK(text != "True" && text != "False" && text != "None",
           "--template-var '%s': the value is read as JSON: write true, false or null", arg.c_str());
  json value = json::parse(text, nullptr, false);
  vars[key] = value.is_discarded() ? json(text) : std::move(value);
}

ChatRenderer::ChatRenderer(const std::string& spec, const std::string& tokenizer, ChatOptions opts)
    : opts_(std::move(opts)) {
  if (spec == "none") {
    DF_CHECK(opts_.template_vars.empty(),
             "--template-var needs a chat template; --chat-template none renders the "
             "contents alone");
    source_ = "none (contents only)";
    return;
  }
  const fs::path dir = fs::is_directory(tokenizer) ? fs::path(tokenizer) : fs::path(tokenizer).parent_path();
  const fs::path config_path = dir / "tokenizer_config.json";
  json config = json::object();
  if (fs::exists(config_path)) config = read_json(config_path.string(), "tokenizer config");
  special_tokens_ = special_tokens(config);
  std::string source;
  if (spec != "auto") {
    source_ = spec;
    source = read_file(spec, "chat template");
  } else if (fs::exists(dir / "chat_template.jinja")) {
    source_ = (dir / "chat_template.jinja").string();
    source = read_file(source_, "chat template");
  } else {
    source_ = config_path.string() + " (chat_template)";
    DF_CHECK(config.contains("chat_template"),
             "%s ships no chat template (no chat_template.jinja, no 'chat_template' in tokenizer_config.json); "
             "HINT: pass --chat-template FILE.jinja, or --chat-template none for the contents alone",
             dir.string().c_str());
    const json& ct = config["chat_template"];
    if (ct.is_string()) {
      source = ct.get<std::string>();
    } else {
      // Several named templates: transformers renders the one named "default" unless told otherwise.
      std::string names;
      DF_CHECK(ct.is_array(), "%s: 'chat_template' must be a string or a list of {name, template}",
               config_path.string().c_str());
      for (const json& t : ct) {
        DF_CHECK(t.is_object() && t.value("name", "") != "" && t.contains("template") && t["template"].is_string(),
                 "%s: every entry of 'chat_template' needs a 'name' and a string 'template'",
                 config_path.string().c_str());
        names += (names.empty() ? "" : ", ") + t["name"].get<std::string>();
        if (t["name"] == "default") source = t["template"].get<std::string>();
      }
      DF_CHECK(!source.empty(), "%s: no chat template named 'default' among: %s; HINT: save the one you want as a "
               ".jinja file and pass --chat-template FILE.jinja", config_path.string().c_str(), names.c_str());
      source_ += " 'default'";
    }
  }
  template_ = std::make_unique<jinja::Template>(source, source_);
  for (auto it = opts_.template_vars.begin(); it != opts_.template_vars.end(); ++it)
    DF_CHECK(template_->reads(it.key()),
             "%s never reads '%s', so --template-var %s would change nothing; HINT: "
             "check the name against the template",
             source_.c_str(), it.key().c_str(), it.key().c_str());
}

std::vector<ChatPiece> ChatRenderer::render(const ChatRecord& rec, const std::string& where) const {
  if (rec.plain) return {{rec.text, true}};
  if (!template_) {
    std::vector<ChatPiece> out;
    for (const json& m : rec.messages) out.push_back({content_text(m["content"]), m["role"] == "assistant"});
    return out;
  }
  json ctx = special_tokens_;
  for (auto it = opts_.template_vars.begin(); it != opts_.template_vars.end(); ++it)
    ctx[it.key()] = it.value();
  ctx["messages"] = rec.messages;
  ctx["tools"] = rec.tools.is_null() ? opts_.tools : rec.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = opts_.add_generation_prompt;
  if (opts_.enable_thinking) ctx["enable_thinking"] = *opts_.enable_thinking;
  std::string text;
  try {
    text = template_->render(ctx);
  } catch (const Error& e) {
    DF_FAIL("%s: %s", where.c_str(), e.what());
  }
  std::vector<ChatPiece> out;
  size_t pos = 0;
  for (size_t h = text.find(kAssistantHeader); h != std::string::npos; h = text.find(kAssistantHeader, pos)) {
    const size_t b = h + kAssistantHeader.size(), e = text.find(kEndOfTurn, b);
    const size_t end = e == std::string::npos ? text.size() : e + kEndOfTurn.size();
    out.push_back({text.substr(pos, b - pos), false});
    if (end > b) out.push_back({text.substr(b, end - b), true});
    pos = end;
  }
  if (pos < text.size()) out.push_back({text.substr(pos), false});
  bool any_assistant = false, any_trained = false;
  for (const json& m : rec.messages) any_assistant |= m["role"] == "assistant";
  for (const ChatPiece& p : out) any_trained |= p.trained;
  DF_CHECK(!any_assistant || any_trained,
           "%s: %s rendered the assistant messages without a '<|im_start|>assistant\\n' header; the loss mask "
           "knows ChatML turns only (HINT: --chat-template none trains the assistant contents alone)",
           where.c_str(), source_.c_str());
  return out;
}

}  // namespace df
