// The lexer of the Jinja interpreter (data/jinja.h): a template becomes chunks of text, `{{ expression }}` and
// `{% statement %}` with transformers' whitespace settings applied, and a tag's source becomes tokens.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace df::jinja {

// One piece of the template: text, a `{{ expression }}` or a `{% statement %}`, with its first line.
struct Chunk {
  enum class Kind { text, var, block } kind;
  std::string src;
  int line;
};

// Splits the template into chunks, applying whitespace control and transformers' trim_blocks / lstrip_blocks
// the way jinja2's lexer does (lexer.py tokeniter): a `-` strips all whitespace on that side; otherwise a
// block or comment tag eats the newline after it, and the spaces before it when only spaces precede it on its
// line.
std::vector<Chunk> jinja_split_chunks(const std::string& raw, const std::string& name);

struct Tok {
  enum class T { name, str, integer, floating, op, end } t = T::end;
  std::string s;
  int64_t i = 0;
  double f = 0;
};

// Names, numbers, string literals (escapes decoded as Python's unicode-escape, which jinja2 applies) and
// operators; `where` (template and line) is what errors name.
std::vector<Tok> jinja_tokenize(const std::string& s, const std::string& where);

}  // namespace df::jinja
