// `data tokenize` against Hugging Face: tests/golden/chat/golden.json holds, for every template in
// tests/golden/chat/templates/ and every conversation of make_chat_golden.py, with enable_thinking true,
// false and unset (and, for a template that reads it, with preserve_thinking), what transformers'
// apply_chat_template rendered, the ids of that text and SpecForge's assistant mask. The C++ renderer must
// give the same text, `chat_tokenize_stream` the same ids and mask, and a conversation the template refused
// must be refused here too (with the template's own message when it raised). DF_CHAT_GOLDEN names another
// golden file, e.g. one `make_chat_golden.py --jinja-only` wrote (texts only).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "data/chat_template.h"
#ifdef DF_HAVE_TOKENIZER
#include "data/chat_tokenize.h"
#endif

namespace df {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

const std::string kChatDir = std::string(DF_SOURCE_DIR) + "/tests/golden/chat";
const std::string kTokenizer = std::string(DF_SOURCE_DIR) + "/tests/golden/tokenizer";

json load_golden() {
  const char* env = std::getenv("DF_CHAT_GOLDEN");
  const std::string path = env ? env : kChatDir + "/golden.json";
  std::ifstream f(path);
  if (!f.is_open()) return json();
  return json::parse(f);
}

TEST(ChatGolden, EveryTemplateHasGoldenCases) {
  const json g = load_golden();
  if (g.is_null()) GTEST_SKIP() << "no tests/golden/chat/golden.json yet: run tests/golden/make_chat_golden.py";
  std::set<std::string> in_dir, in_golden;
  for (const auto& e : fs::directory_iterator(kChatDir + "/templates"))
    if (e.path().extension() == ".jinja") in_dir.insert(e.path().filename().string());
  for (const json& c : g["cases"]) in_golden.insert(c["template"].get<std::string>());
  EXPECT_EQ(in_dir, in_golden) << "a template without golden cases: rerun make_chat_golden.py";
}

TEST(ChatGolden, RendersTokenizesAndMasksAsHuggingFace) {
  const json g = load_golden();
  if (g.is_null()) GTEST_SKIP() << "no tests/golden/chat/golden.json yet: run tests/golden/make_chat_golden.py";
  std::map<std::string, std::unique_ptr<ChatRenderer>> renderers;
#ifdef DF_HAVE_TOKENIZER
  BpeTokenizer tok(kTokenizer);
#endif
  int rendered = 0, refused = 0, with_ids = 0;
  for (const json& c : g["cases"]) {
    ChatOptions o;
    if (c.contains("enable_thinking")) o.enable_thinking = c["enable_thinking"].get<bool>();
    o.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    if (c.contains("template_vars")) o.template_vars = c["template_vars"];
    const std::string tname = c["template"].get<std::string>();
    const std::string label = tname + " / " + c["case"].get<std::string>() + " / enable_thinking " +
                              (o.enable_thinking ? (*o.enable_thinking ? "true" : "false") : "unset") +
                              (o.add_generation_prompt ? " / add_generation_prompt" : "") +
                              (o.template_vars.empty() ? "" : " / " + o.template_vars.dump());
    const std::string key = tname + "|" + label.substr(label.find("enable_thinking"));
    auto& r = renderers[key];
    if (!r) r = std::make_unique<ChatRenderer>(kChatDir + "/templates/" + tname, kTokenizer, o);
    const std::string line = c["record"].dump();
    if (c.contains("error")) {
      const std::string want = c["error"].get<std::string>();
      try {
        r->render(chat_parse_line(line, label), label);
        ADD_FAILURE() << label << ": rendered, but Hugging Face refused it: " << want;
      } catch (const Error& e) {
        const std::string raised = "TemplateError: ";
        if (want.rfind(raised, 0) == 0)
          EXPECT_NE(std::string(e.what()).find(want.substr(raised.size())), std::string::npos)
              << label << ": " << e.what();
      }
      ++refused;
      continue;
    }
    std::string text;
    for (const ChatPiece& p : r->render(chat_parse_line(line, label), label)) text += p.text;
    EXPECT_EQ(text, c["text"].get<std::string>()) << label;
    ++rendered;
#ifdef DF_HAVE_TOKENIZER
    if (!c.contains("ids")) continue;
    std::istringstream in(line + "\n");
    const TokenData d = chat_tokenize_stream(in, label, tok, *r, 0, 0, nullptr);
    EXPECT_EQ(d.tokens, c["ids"].get<std::vector<int32_t>>()) << label;
    if (c.contains("mask")) {
      std::vector<int32_t> mask(d.loss_mask.begin(), d.loss_mask.end());
      EXPECT_EQ(mask, c["mask"].get<std::vector<int32_t>>()) << label;
    } else {
      EXPECT_TRUE(d.loss_mask.empty()) << label << ": a prompt file carries no loss_mask";
    }
    ++with_ids;
#endif
  }
  EXPECT_GT(rendered, 100);
  EXPECT_GT(refused, 0);
  std::printf("%d renderings equal, %d refusals as Hugging Face's, %d with ids and mask compared (%s)\n", rendered,
              refused, with_ids, g["versions"].dump().c_str());
}

}  // namespace
}  // namespace df
