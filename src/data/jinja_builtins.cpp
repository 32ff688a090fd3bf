// Filters (jinja2 filters.py, with transformers' own `tojson`), tests (jinja2 tests.py) and the Python str and
// dict methods chat templates call. Each behaves as its Python original on the values a chat holds; a type
// Python would reject is an error here too.
#include "data/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace df::jinja {

namespace {

const char* const kFilters[] = {"length", "count",   "items", "trim",  "tojson", "safe",    "string", "list",
                                "first",  "last",    "join",  "default", "d",    "lower",   "upper",  "replace",
                                "int",    "float",   "reverse", "abs", "capitalize"};
const char* const kTests[] = {"defined", "undefined", "none",    "string", "mapping", "iterable", "sequence",
                              "number",  "integer",   "float",   "boolean", "true",   "false",    "callable",
                              "even",    "odd",       "divisibleby", "eq",   "equalto", "ne",     "in"};

void want_args(const std::string& what, const std::vector<Value>& args, size_t lo, size_t hi) {
  DF_CHECK(args.size() >= lo && args.size() <= hi, "%s takes %zu to %zu arguments, got %zu", what.c_str(), lo, hi,
           args.size());
}

const std::string& want_str(const std::string& what, const Value& v) {
  DF_CHECK(v.is_string(), "%s needs a str, not '%s'", what.c_str(), value_type_name(v));
  return v.s;
}

int64_t double_to_int(double d, const std::string& what) {
  DF_CHECK(std::isfinite(d) && std::fabs(d) < 9.2e18, "%s: %g does not fit a 64-bit integer", what.c_str(), d);
  return int64_t(d);
}

std::string ascii_case(const std::string& what, const std::string& s, bool upper) {
  std::string out = s;
  for (char& c : out) {
    DF_CHECK(static_cast<unsigned char>(c) < 0x80, "%s of non-ASCII text is not supported by this renderer",
             what.c_str());
    c = char(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// Python str.split(sep, maxsplit): with no separator, runs of whitespace split and empty pieces are dropped.
List py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (!sep || sep->kind == Value::Kind::none) {
    const std::u32string u = utf8_decode(s);
    size_t k = 0;
    while (k < u.size()) {
      while (k < u.size() && py_isspace(u[k])) ++k;
      if (k >= u.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        size_t e = u.size();
        while (e > k && py_isspace(u[e - 1])) --e;
        out.push_back(Value::string(utf8_encode(u.substr(k, e - k))));
        return out;
      }
      size_t e = k;
      while (e < u.size() && !py_isspace(u[e])) ++e;
      out.push_back(Value::string(utf8_encode(u.substr(k, e - k))));
      k = e;
    }
    return out;
  }
  const std::string& d = want_str("str.split", *sep);
  DF_CHECK(!d.empty(), "str.split: empty separator");
  size_t k = 0;
  for (;;) {
    const size_t e = s.find(d, k);
    if (e == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) {
      out.push_back(Value::string(s.substr(k)));
      return out;
    }
    out.push_back(Value::string(s.substr(k, e - k)));
    k = e + d.size();
  }
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {  // Python inserts `to` between every code point
    const std::u32string u = utf8_decode(s);
    std::string out;
    int64_t n = 0;
    for (size_t k = 0; k <= u.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (k < u.size()) out += utf8_encode(u.substr(k, 1));
    }
    return out;
  }
  std::string out;
  size_t k = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t e = s.find(from, k);
    if (e == std::string::npos) break;
    out += s.substr(k, e - k) + to;
    k = e + from.size();
  }
  return out + s.substr(k);
}

bool starts_or_ends(const std::string& s, const Value& affix, bool start) {
  if (affix.kind == Value::Kind::list) {
    for (const Value& a : *affix.list)
      if (starts_or_ends(s, a, start)) return true;
    return false;
  }
  const std::string& a = want_str(start ? "str.startswith" : "str.endswith", affix);
  if (a.size() > s.size()) return false;
  return start ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
}

List iterate(const Value& v, const char* what) {
  switch (v.kind) {
    case Value::Kind::undefined: return {};
    case Value::Kind::list: return *v.list;
    case Value::Kind::dict: {
      List keys;
      for (const auto& kv : *v.dict) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Value::Kind::string: {
      List chars;
      for (char32_t c : utf8_decode(v.s)) chars.push_back(Value::string(utf8_encode(std::u32string(1, c))));
      return chars;
    }
    default: DF_FAIL("%s: '%s' object is not iterable", what, value_type_name(v));
  }
}

}  // namespace

bool jinja_filter_exists(const std::string& name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool jinja_test_exists(const std::string& name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

Value jinja_filter_apply(const std::string& name, const Value& v, const std::vector<Value>& args,
                         const std::vector<std::string>& kwargs) {
  const std::string what = "filter '" + name + "'";
  if (name == "tojson") {
    // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False): only the
    // defaults are implemented.
    DF_CHECK(args.empty(), "%s: arguments (indent, separators, ...) are not supported by this renderer", what.c_str());
    return Value::string(value_tojson(v));
  }
  DF_CHECK(kwargs.empty() || name == "default" || name == "d",
           "%s: keyword arguments are not supported by this renderer", what.c_str());
  if (name == "length" || name == "count") {
    want_args(what, args, 0, 0);
    switch (v.kind) {
      case Value::Kind::undefined: return Value::integer(0);
      case Value::Kind::string: return Value::integer(int64_t(utf8_decode(v.s).size()));
      case Value::Kind::list: return Value::integer(int64_t(v.list->size()));
      case Value::Kind::dict: return Value::integer(int64_t(v.dict->size()));
      default: DF_FAIL("%s: object of type '%s' has no len()", what.c_str(), value_type_name(v));
    }
  }
  if (name == "items") {
    want_args(what, args, 0, 0);
    if (v.is_undefined()) return Value::make_list({});
    DF_CHECK(v.is_mapping(), "Can only get item pairs from a mapping (got '%s')", value_type_name(v));
    List out;
    for (const auto& kv : *v.dict) out.push_back(Value::make_tuple({Value::string(kv.first), kv.second}));
    return Value::make_list(std::move(out));
  }
  if (name == "trim") {
    want_args(what, args, 0, 1);
    return Value::string(py_strip(value_str(v), args.empty() ? "" : want_str(what, args[0]), true, true));
  }
  if (name == "safe" || name == "string") {
    want_args(what, args, 0, 0);
    return v.is_string() ? v : Value::string(value_str(v));
  }
  if (name == "list") {
    want_args(what, args, 0, 0);
    return Value::make_list(iterate(v, what.c_str()));
  }
  if (name == "first" || name == "last") {
    want_args(what, args, 0, 0);
    const List l = iterate(v, what.c_str());
    if (l.empty()) return Value();
    return name == "first" ? l.front() : l.back();
  }
  if (name == "join") {
    want_args(what, args, 0, 1);
    const std::string sep = args.empty() ? "" : value_str(args[0]);
    std::string out;
    const List l = iterate(v, what.c_str());
    for (size_t k = 0; k < l.size(); ++k) out += (k ? sep : "") + value_str(l[k]);
    return Value::string(out);
  }
  if (name == "default" || name == "d") {
    bool boolean = args.size() >= 2 && kwargs.empty() && value_truthy(args[1]);
    for (size_t k = 0; k < kwargs.size(); ++k) {
      DF_CHECK(kwargs[k] == "boolean", "%s: unknown keyword '%s'", what.c_str(), kwargs[k].c_str());
      boolean = value_truthy(args[args.size() - kwargs.size() + k]);
    }
    const Value fallback = args.empty() ? Value::string("") : args[0];
    return v.is_undefined() || (boolean && !value_truthy(v)) ? fallback : v;
  }
  if (name == "lower" || name == "upper") {
    want_args(what, args, 0, 0);
    return Value::string(ascii_case(what, value_str(v), name == "upper"));
  }
  if (name == "capitalize") {
    want_args(what, args, 0, 0);
    std::string s = ascii_case(what, value_str(v), false);
    if (!s.empty()) s[0] = char(std::toupper(static_cast<unsigned char>(s[0])));
    return Value::string(s);
  }
  if (name == "replace") {
    want_args(what, args, 2, 3);
    return Value::string(py_replace(value_str(v), value_str(args[0]), value_str(args[1]),
                                    args.size() == 3 ? args[2].i : -1));
  }
  if (name == "int") {
    want_args(what, args, 0, 1);
    if (v.kind == Value::Kind::integer) return v;
    if (v.kind == Value::Kind::boolean) return Value::integer(v.b);
    if (v.kind == Value::Kind::floating) return Value::integer(double_to_int(v.f, what));
    if (v.is_string()) {
      const std::string t = py_strip(v.s, "", true, true);
      char* end = nullptr;
      const long long x = std::strtoll(t.c_str(), &end, 10);
      if (!t.empty() && *end == 0) return Value::integer(x);
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && *end == 0) return Value::integer(double_to_int(d, what));
    }
    return args.empty() ? Value::integer(0) : args[0];
  }
  if (name == "float") {
    want_args(what, args, 0, 1);
    if (v.is_number()) return Value::floating(value_as_double(v));
    if (v.is_string()) {
      const std::string t = py_strip(v.s, "", true, true);
      char* end = nullptr;
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && *end == 0) return Value::floating(d);
    }
    return args.empty() ? Value::floating(0) : args[0];
  }
  if (name == "abs") {
    want_args(what, args, 0, 0);
    if (v.kind == Value::Kind::floating) return Value::floating(v.f < 0 ? -v.f : v.f);
    DF_CHECK(v.is_number(), "%s: bad operand type for abs(): '%s'", what.c_str(), value_type_name(v));
    const int64_t x = v.kind == Value::Kind::boolean ? int64_t(v.b) : v.i;
    DF_CHECK(x != INT64_MIN, "%s: integer overflow", what.c_str());
    return Value::integer(x < 0 ? -x : x);
  }
  if (name == "reverse") {
    want_args(what, args, 0, 0);
    if (v.is_string()) {
      std::u32string u = utf8_decode(v.s);
      std::reverse(u.begin(), u.end());
      return Value::string(utf8_encode(u));
    }
    List l = iterate(v, what.c_str());
    std::reverse(l.begin(), l.end());
    return Value::make_list(std::move(l));
  }
  DF_FAIL("the filter '%s' is not supported by this renderer", name.c_str());
}

bool jinja_test_apply(const std::string& name, const Value& v, const std::vector<Value>& args) {
  const std::string what = "test '" + name + "'";
  const size_t want = (name == "divisibleby" || name == "eq" || name == "equalto" || name == "ne" || name == "in");
  DF_CHECK(args.size() == want, "%s takes %zu argument(s), got %zu", what.c_str(), want, args.size());
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.kind == K::none;
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_mapping();
  // jinja2 tries iter() / len(): Undefined iterates as empty, so both hold for it as for str, list and dict.
  if (name == "iterable" || name == "sequence")
    return v.is_undefined() || v.is_string() || v.kind == K::list || v.is_mapping();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == K::integer;
  if (name == "float") return v.kind == K::floating;
  if (name == "boolean") return v.kind == K::boolean;
  if (name == "true") return v.kind == K::boolean && v.b;
  if (name == "false") return v.kind == K::boolean && !v.b;
  if (name == "callable") return v.kind == K::macro || v.kind == K::builtin;
  if (name == "even" || name == "odd") {
    DF_CHECK(v.kind == K::integer || v.kind == K::boolean, "%s needs an integer, not '%s'", what.c_str(),
             value_type_name(v));
    const int64_t x = v.kind == K::boolean ? int64_t(v.b) : v.i;
    return ((x % 2 + 2) % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    DF_CHECK(v.kind == K::integer && args[0].kind == K::integer && args[0].i != 0,
             "%s needs integers and a non-zero divisor", what.c_str());
    return v.i % args[0].i == 0;
  }
  if (name == "eq" || name == "equalto") return value_equal(v, args[0]);
  if (name == "ne") return !value_equal(v, args[0]);
  if (name == "in") return jinja_contains(args[0], v);
  DF_FAIL("the test '%s' is not supported by this renderer", name.c_str());
}

bool jinja_method_call(const Value& obj, const std::string& name, const std::vector<Value>& args, Value* out) {
  const std::string what = "str." + name + "()";
  if (obj.is_string()) {
    const std::string& s = obj.s;
    if (name == "startswith" || name == "endswith") {
      want_args(what, args, 1, 1);
      *out = Value::boolean(starts_or_ends(s, args[0], name == "startswith"));
    } else if (name == "strip" || name == "lstrip" || name == "rstrip") {
      want_args(what, args, 0, 1);
      const std::string chars = args.empty() || args[0].kind == Value::Kind::none ? "" : want_str(what, args[0]);
      if (!args.empty() && args[0].is_string() && chars.empty()) {
        *out = obj;  // strip('') strips nothing
      } else {
        *out = Value::string(py_strip(s, chars, name != "rstrip", name != "lstrip"));
      }
    } else if (name == "split") {
      want_args(what, args, 0, 2);
      *out = Value::make_list(py_split(s, args.empty() ? nullptr : &args[0], args.size() == 2 ? args[1].i : -1));
    } else if (name == "upper" || name == "lower") {
      want_args(what, args, 0, 0);
      *out = Value::string(ascii_case(what, s, name == "upper"));
    } else if (name == "replace") {
      want_args(what, args, 2, 3);
      *out = Value::string(py_replace(s, want_str(what, args[0]), want_str(what, args[1]),
                                      args.size() == 3 ? args[2].i : -1));
    } else if (name == "join") {
      want_args(what, args, 1, 1);
      std::string r;
      const List l = iterate(args[0], what.c_str());
      for (size_t k = 0; k < l.size(); ++k) r += (k ? s : "") + want_str(what, l[k]);
      *out = Value::string(r);
    } else {
      return false;
    }
    return true;
  }
  if (obj.is_mapping()) {
    const std::string dwhat = "dict." + name + "()";
    if (name == "items" || name == "keys" || name == "values") {
      want_args(dwhat, args, 0, 0);
      List l;
      for (const auto& kv : *obj.dict)
        l.push_back(name == "items"  ? Value::make_tuple({Value::string(kv.first), kv.second})
                    : name == "keys" ? Value::string(kv.first)
                                     : kv.second);
      *out = Value::make_list(std::move(l));
    } else if (name == "get") {
      want_args(dwhat, args, 1, 2);
      const Value* f = args[0].is_string() ? obj.find(args[0].s) : nullptr;
      *out = f ? *f : args.size() == 2 ? args[1] : Value::none_value();
    } else {
      return false;
    }
    return true;
  }
  return false;
}

bool jinja_contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::Kind::string:
      DF_CHECK(item.is_string(), "'in <string>' requires string as left operand, not %s", value_type_name(item));
      return container.s.find(item.s) != std::string::npos;
    case Value::Kind::list:
      for (const Value& e : *container.list)
        if (value_equal(e, item)) return true;
      return false;
    case Value::Kind::dict: return item.is_string() && container.find(item.s) != nullptr;
    case Value::Kind::undefined: return false;
    default: DF_FAIL("argument of type '%s' is not iterable", value_type_name(container));
  }
}

}  // namespace df::jinja
