// A small Jinja interpreter for chat templates: the subset that Qwen3, Qwen3.5 and Qwen3.6 templates use
// (if/for/set/macro, loop.* and break/continue, namespace(), the filters, tests and str/dict methods in
// data/jinja_builtins.h, raise_exception, strftime_now), rendered in Hugging Face transformers' environment
// (trim_blocks, lstrip_blocks, Python value semantics, `tojson` as json.dumps with ensure_ascii=False), so a
// conversation renders to the same text as `apply_chat_template`. No Jinja library is packaged for C++ in
// Debian; a construct outside the subset is refused when the template is read, naming it and its line.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "data/jinja_parse.h"

namespace df::jinja {

class Template {
 public:
  // `name` is what errors call the template (its file). Throws df::Error for a syntax error or an unsupported
  // construct.
  Template(const std::string& source, const std::string& name);

  // Renders with the top-level variables of `context` (an object: messages, tools, add_generation_prompt, ...).
  // Throws df::Error naming the template line for raise_exception() and for what Python would raise (an
  // undefined value used, a type error); the message of raise_exception is kept verbatim.
  std::string render(const nlohmann::ordered_json& context) const;

  // Whether the template reads the variable `name` anywhere (an `is defined` test counts), so a caller can
  // refuse a variable it was asked to pass that the template would ignore.
  bool reads(const std::string& name) const;

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  Body body_;
};

}  // namespace df::jinja
