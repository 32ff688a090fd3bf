// Conversation records and the template a model ships: where `auto` finds it (chat_template.jinja before
// tokenizer_config.json, a list of named templates), the special tokens transformers passes, the ChatML loss
// spans (SpecForge's rule), `none`, and the errors for malformed records, templates and tools files.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "data/chat_template.h"
#include "test_data_util.h"

namespace df {
namespace {

using json = nlohmann::ordered_json;
using df_test::error_of;
using df_test::ScratchDir;

// A ChatML template in the style of Qwen's: system/user turns, assistant turns with their reasoning in a think
// block, an optional generation prompt.
const char* kChatml =
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and m.reasoning_content is defined %}"
    "{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}";

std::string joined(const std::vector<ChatPiece>& pieces, bool trained_only) {
  std::string out;
  for (const ChatPiece& p : pieces)
    if (!trained_only || p.trained) out += p.text + (trained_only ? "|" : "");
  return out;
}

TEST(ChatTemplate, AutoFindsTheModelsTemplateAndPassesItsSpecialTokens) {
  ScratchDir dir;
  std::ofstream(dir.path() / "tokenizer.json") << "{}";
  json config = {{"eos_token", {{"content", "<|im_end|>"}}}, {"bos_token", nullptr},
                 {"chat_template", "{{ messages[0].content }}{{ eos_token }}{{ bos_token is defined }}"}};
  std::ofstream(dir.path() / "tokenizer_config.json") << config.dump();
  const ChatRecord rec = chat_parse_line(R"({"messages": [{"role": "user", "content": "hi"}]})", "r");
  // A directory or its tokenizer.json: the template in tokenizer_config.json, eos_token defined, a null one not.
  for (const std::string& tok : {dir.path().string(), (dir.path() / "tokenizer.json").string()}) {
    ChatRenderer r("auto", tok, {});
    EXPECT_EQ(joined(r.render(rec, "r"), false), "hi<|im_end|>False");
    EXPECT_NE(r.source().find("tokenizer_config.json"), std::string::npos);
  }
  std::ofstream(dir.path() / "chat_template.jinja") << "jinja file: {{ messages|length }}\n";
  ChatRenderer file("auto", dir.path().string(), {});
  EXPECT_EQ(joined(file.render(rec, "r"), false), "jinja file: 1");  // the file wins; its last newline dropped
  ChatRenderer named((dir.path() / "chat_template.jinja").string(), dir.path().string(), {});
  EXPECT_EQ(joined(named.render(rec, "r"), false), "jinja file: 1");
  std::filesystem::remove(dir.path() / "chat_template.jinja");

  config["chat_template"] = json::array({json{{"name", "tool_use"}, {"template", "T"}},
                                         json{{"name", "default"}, {"template", "D{{ messages|length }}"}}});
  std::ofstream(dir.path() / "tokenizer_config.json") << config.dump();
  EXPECT_EQ(joined(ChatRenderer("auto", dir.path().string(), {}).render(rec, "r"), false), "D1");
  config["chat_template"] = json::array({json{{"name", "tool_use"}, {"template", "T"}}});
  std::ofstream(dir.path() / "tokenizer_config.json") << config.dump();
  EXPECT_NE(error_of([&] { ChatRenderer("auto", dir.path().string(), {}); }).find("no chat template named 'default' "
                                                                                 "among: tool_use"),
            std::string::npos);
  config.erase("chat_template");
  std::ofstream(dir.path() / "tokenizer_config.json") << config.dump();
  const std::string e = error_of([&] { ChatRenderer("auto", dir.path().string(), {}); });
  EXPECT_NE(e.find("ships no chat template"), std::string::npos) << e;
  EXPECT_NE(e.find("HINT: pass --chat-template FILE.jinja"), std::string::npos) << e;
  std::ofstream(dir.path() / "bad.jinja") << "ok\n{% include 'x' %}";
  EXPECT_NE(error_of([&] { ChatRenderer((dir.path() / "bad.jinja").string(), dir.path().string(), {}); })
                .find("bad.jinja line 2: the '{% include %}' tag is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ChatRenderer((dir.path() / "missing.jinja").string(), dir.path().string(), {}); })
                .find("missing.jinja: cannot open the chat template"),
            std::string::npos);
}

TEST(ChatTemplate, LossSpansAreTheAssistantTurnsAsRendered) {
  ScratchDir dir;
  std::ofstream(dir.path() / "t.jinja") << kChatml;
  const ChatRecord rec = chat_parse_line(
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"},)"
      R"( {"role": "assistant", "content": "A1", "reasoning_content": "R1"}, {"role": "user", "content": "Q2"},)"
      R"( {"role": "assistant", "content": "A2"}]})",
      "r");
  ChatRenderer r((dir.path() / "t.jinja").string(), dir.path().string(), {});
  const std::vector<ChatPiece> p = r.render(rec, "r");
  EXPECT_EQ(joined(p, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\nR1\n"
            "</think>\n\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\nA2<|im_end|>\n");
  // After each assistant header, through its <|im_end|>\n: the think block in, the header out.
  EXPECT_EQ(joined(p, true), "<think>\nR1\n</think>\n\nA1<|im_end|>\n|A2<|im_end|>\n|");

  ChatOptions prompt;
  prompt.add_generation_prompt = true;
  prompt.enable_thinking = false;
  ChatRenderer g((dir.path() / "t.jinja").string(), dir.path().string(), prompt);
  const ChatRecord q = chat_parse_line(R"({"messages": [{"role": "user", "content": "Q"}]})", "r");
  EXPECT_EQ(joined(g.render(q, "r"), false), "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
                                             "</think>\n\n");
  EXPECT_TRUE(g.add_generation_prompt());

  ChatRenderer none("none", dir.path().string(), {});
  EXPECT_EQ(joined(none.render(rec, "r"), true), "A1|A2|");
  EXPECT_EQ(joined(none.render(rec, "r"), false), "SQ1A1Q2A2");
  const ChatRecord text = chat_parse_line(R"({"text": "plain"})", "r");
  EXPECT_EQ(joined(r.render(text, "r"), true), "plain|");

  // A template that renders assistant turns without ChatML headers has no spans the mask could use.
  std::ofstream(dir.path() / "plain.jinja") << "{% for m in messages %}{{ m.content }}{% endfor %}";
  ChatRenderer plain((dir.path() / "plain.jinja").string(), dir.path().string(), {});
  EXPECT_NE(error_of([&] { plain.render(rec, "chats.jsonl line 4"); })
                .find("chats.jsonl line 4: " + (dir.path() / "plain.jinja").string() + " rendered the assistant messages "
                      "without a '<|im_start|>assistant\\n' header"),
            std::string::npos);
  // Template errors name the record and the template line.
  std::ofstream(dir.path() / "raise.jinja") << "\n{{ raise_exception('No user query found in messages.') }}";
  ChatRenderer raise((dir.path() / "raise.jinja").string(), dir.path().string(), {});
  const std::string e = error_of([&] { raise.render(rec, "chats.jsonl line 9"); });
  EXPECT_NE(e.find("chats.jsonl line 9: "), std::string::npos) << e;
  EXPECT_NE(e.find("raise.jinja line 2: "), std::string::npos) << e;
  EXPECT_NE(e.find("No user query found in messages."), std::string::npos) << e;
}

TEST(ChatTemplate, RecordsKeepEveryKeyAndToolsComeFromTheRecordOrTheFile) {
  ScratchDir dir;
  std::ofstream(dir.path() / "t.jinja") << "{{ tools|tojson }}|{{ messages|tojson }}";
  const ChatRecord share = chat_parse_line(
      R"({"conversations": [{"from": "human", "value": "Q", "lang": "en"}, {"from": "gpt", "value": "A"}]})", "r");
  EXPECT_EQ(share.messages.dump(), R"([{"role":"user","content":"Q","lang":"en"},{"role":"assistant","content":"A"}])");
  std::ofstream(dir.path() / "tools.json") << R"([{"type": "function", "function": {"name": "f"}}])";
  ChatOptions o;
  o.tools = chat_tools_read((dir.path() / "tools.json").string());
  ChatRenderer r((dir.path() / "t.jinja").string(), dir.path().string(), o);
  const ChatRecord own = chat_parse_line(
      R"({"tools": [{"type": "function", "function": {"name": "g"}}], "messages": [{"role": "user", "content": "x",)"
      R"( "reasoning_content": null, "z": 1}]})",
      "r");
  EXPECT_EQ(joined(r.render(own, "r"), false),
            R"([{"type": "function", "function": {"name": "g"}}]|[{"role": "user", "content": "x", )"
            R"("reasoning_content": null, "z": 1}])");
  const ChatRecord plain = chat_parse_line(R"({"messages": [{"role": "user", "content": "x"}]})", "r");
  EXPECT_EQ(joined(r.render(plain, "r"), false),
            R"([{"type": "function", "function": {"name": "f"}}]|[{"role": "user", "content": "x"}])");
  ChatRenderer no_tools((dir.path() / "t.jinja").string(), dir.path().string(), {});
  EXPECT_EQ(joined(no_tools.render(plain, "r"), false), R"(null|[{"role": "user", "content": "x"}])");

  std::ofstream(dir.path() / "bad_tools.json") << R"({"name": "f"})";
  EXPECT_NE(error_of([&] { chat_tools_read((dir.path() / "bad_tools.json").string()); })
                .find("bad_tools.json: the --tools file must hold a JSON array"),
            std::string::npos);
  std::ofstream(dir.path() / "broken.json") << "[";
  EXPECT_NE(error_of([&] { chat_tools_read((dir.path() / "broken.json").string()); }).find("is not valid JSON"),
            std::string::npos);
}

TEST(ChatTemplate, TemplateVarsReachTheTemplateOnlyWhenItReadsThem) {
  ScratchDir dir;
  const std::string qwen36 = std::string(DF_SOURCE_DIR) + "/tests/golden/chat/templates/qwen3.6.jinja";
  const ChatRecord rec = chat_parse_line(
      R"({"messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1",)"
      R"( "reasoning_content": "R1"}, {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}]})",
      "r");
  // Qwen3.6 drops the reasoning of turns before the last user message unless preserve_thinking is true.
  const std::string dropped = "<|im_start|>assistant\nA1<|im_end|>\n";
  const std::string kept = "<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>\n";
  const std::string plain = joined(ChatRenderer(qwen36, dir.path().string(), {}).render(rec, "r"), false);
  EXPECT_NE(plain.find(dropped), std::string::npos) << plain;
  ChatOptions o;
  chat_template_var_add(o.template_vars, "preserve_thinking=true");
  const std::vector<ChatPiece> p = ChatRenderer(qwen36, dir.path().string(), o).render(rec, "r");
  EXPECT_NE(joined(p, false).find(kept), std::string::npos) << joined(p, false);
  EXPECT_EQ(joined(p, true),
            "<think>\nR1\n</think>\n\nA1<|im_end|>\n|<think>\n\n</think>\n\nA2<|im_end|>\n|");

  // Values are JSON, else strings; they override the tokenizer's special tokens, as apply_chat_template's
  // kwargs.
  json vars = json::object();
  for (const char* a : {"n=3", "s=\"quoted\"", "w=bare word", "l=[1, \"x\"]", "e=", "eos_token=</s>"})
    chat_template_var_add(vars, a);
  EXPECT_EQ(vars.dump(), R"({"n":3,"s":"quoted","w":"bare word","l":[1,"x"],"e":"","eos_token":"</s>"})");
  std::ofstream(dir.path() / "tokenizer_config.json") << R"({"eos_token": "<|im_end|>"})";
  std::ofstream(dir.path() / "v.jinja") << "{{ n + 1 }} {{ w }} {{ eos_token }}";
  const ChatRecord q = chat_parse_line(R"({"messages": [{"role": "user", "content": "Q"}]})", "r");
  ChatOptions v;
  chat_template_var_add(v.template_vars, "n=41");
  chat_template_var_add(v.template_vars, "w=x y");
  EXPECT_EQ(
      joined(ChatRenderer((dir.path() / "v.jinja").string(), dir.path().string(), v).render(q, "r"), false),
      "42 x y <|im_end|>");
  chat_template_var_add(v.template_vars, "eos_token=</s>");
  EXPECT_EQ(
      joined(ChatRenderer((dir.path() / "v.jinja").string(), dir.path().string(), v).render(q, "r"), false),
      "42 x y </s>");

  auto add_error = [](const std::string& arg) {
    json vars = {{"twice", 1}};
    return error_of([&] { chat_template_var_add(vars, arg); });
  };
  EXPECT_NE(add_error("preserve_thinking").find("expected KEY=VALUE"), std::string::npos);
  EXPECT_NE(add_error("=1").find("'' is not a variable name"), std::string::npos);
  EXPECT_NE(add_error("2x=1").find("'2x' is not a variable name"), std::string::npos);
  EXPECT_NE(add_error("a-b=1").find("'a-b' is not a variable name"), std::string::npos);
  EXPECT_NE(add_error("enable_thinking=true").find("enable_thinking has its own option"), std::string::npos);
  EXPECT_NE(add_error("messages=[]").find("messages has its own option"), std::string::npos);
  EXPECT_NE(add_error("twice=2").find("twice is given twice"), std::string::npos);
  EXPECT_NE(add_error("preserve_thinking=True").find("write true, false or null"), std::string::npos);

  // A variable the template never reads would change nothing: refused, naming the template; none has no
  // template.
  ChatOptions typo;
  chat_template_var_add(typo.template_vars, "preserve_thinkin=true");
  std::string e = error_of([&] { ChatRenderer(qwen36, dir.path().string(), typo); });
  EXPECT_NE(e.find(qwen36 + " never reads 'preserve_thinkin'"), std::string::npos) << e;
  e = error_of([&] { ChatRenderer("none", dir.path().string(), o); });
  EXPECT_NE(e.find("--template-var needs a chat template"), std::string::npos) << e;
}

TEST(ChatTemplate, MalformedLinesNameTheLineAndTheField) {
  auto msg = [](const std::string& line) { return error_of([&] { chat_parse_line(line, "chats.jsonl line 7"); }); };
  EXPECT_NE(msg("{not json").find("chats.jsonl line 7: not valid JSON"), std::string::npos);
  EXPECT_NE(msg(R"({"messages": []})").find("non-empty array 'messages'"), std::string::npos);
  EXPECT_NE(msg(R"({"conversations": [{"from": "wizard", "value": "x"}]})")
                .find("conversations[0]: unknown ShareGPT role 'wizard'"),
            std::string::npos);
  EXPECT_NE(msg(R"({"messages": [{"role": "user"}]})").find("messages[0]: needs 'content'"), std::string::npos);
  EXPECT_NE(msg(R"({"messages": [{"content": "x"}]})").find("messages[0]: needs a string 'role'"), std::string::npos);
  EXPECT_NE(msg(R"({"messages": [{"role": "user", "content": [{"type": "image"}]}]})").find("content[0] is not a text"),
            std::string::npos);
  EXPECT_NE(msg(R"({"tools": {"a": 1}, "messages": [{"role": "user", "content": "x"}]})")
                .find("'tools' must be an array"),
            std::string::npos);
}

}  // namespace
}  // namespace df
