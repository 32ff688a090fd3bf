// Values of the Jinja interpreter (data/jinja.h) with Python's semantics, because chat templates are rendered
// by Python's jinja2 and the text must match it byte for byte: str() of numbers and containers, json.dumps as
// transformers' `tojson` calls it, truthiness, equality and ordering, and str methods that count code points.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace df::jinja {

struct Value;
struct MacroDef;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python dicts keep it

struct Value {
  enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, ns, macro, builtin };
  Kind kind = Kind::undefined;
  bool b = false;
  bool tuple = false;  // a list that Python holds as a tuple: prints as (a, b)
  int64_t i = 0;
  double f = 0;
  std::string s;                  // string; builtin: the function's name
  std::shared_ptr<List> list;     // list (tuples too)
  std::shared_ptr<Dict> dict;     // dict, or a namespace's attributes (shared: `set ns.x` is seen by every holder)
  const MacroDef* macro = nullptr;

  static Value none_value();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value floating(double v);
  static Value string(std::string v);
  static Value make_list(List v);
  static Value make_tuple(List v);
  static Value make_dict(Dict v);

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_string() const { return kind == Kind::string; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }
  bool is_mapping() const { return kind == Kind::dict; }
  const Value* find(const std::string& key) const;  // dict or namespace entry, or nullptr
};

const char* value_type_name(const Value& v);  // Python's type name, for error messages: 'str', 'list', 'NoneType'
Value value_from_json(const nlohmann::ordered_json& j);
bool value_truthy(const Value& v);
bool value_equal(const Value& a, const Value& b);
// Python's a < b for numbers, strings (code point order) and lists; throws Error for other pairs.
bool value_less(const Value& a, const Value& b);
double value_as_double(const Value& v);

std::string value_str(const Value& v);   // Python str(): what {{ x }}, ~ and the `string` filter print
std::string value_repr(const Value& v);  // Python repr(): how str() prints the items of a list or dict
std::string value_tojson(const Value& v);  // json.dumps(v, ensure_ascii=False) with its default separators

// Text as Python sees it: a sequence of code points (UTF-8 in and out).
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);
bool py_isspace(char32_t c);
// str.strip / lstrip / rstrip: `chars` empty strips Python whitespace, else those code points.
std::string py_strip(const std::string& s, const std::string& chars, bool left, bool right);

}  // namespace df::jinja
