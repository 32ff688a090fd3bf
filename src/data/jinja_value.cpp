// Python's printing, comparison and string rules for the Jinja values (data/jinja_value.h).
#include "data/jinja_value.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace df::jinja {

Value Value::none_value() {
  Value v;
  v.kind = Kind::none;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::boolean;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::integer;
  v.i = x;
  return v;
}
Value Value::floating(double x) {
  Value v;
  v.kind = Kind::floating;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::string;
  v.s = std::move(x);
  return v;
}
Value Value::make_list(List x) {
  Value v;
  v.kind = Kind::list;
  v.list = std::make_shared<List>(std::move(x));
  return v;
}
Value Value::make_tuple(List x) {
  Value v = make_list(std::move(x));
  v.tuple = true;
  return v;
}
Value Value::make_dict(Dict x) {
  Value v;
  v.kind = Kind::dict;
  v.dict = std::make_shared<Dict>(std::move(x));
  return v;
}

const Value* Value::find(const std::string& key) const {
  if ((kind != Kind::dict && kind != Kind::ns) || !dict) return nullptr;
  for (const auto& kv : *dict)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

const char* value_type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return "Undefined";
    case Value::Kind::none: return "NoneType";
    case Value::Kind::boolean: return "bool";
    case Value::Kind::integer: return "int";
    case Value::Kind::floating: return "float";
    case Value::Kind::string: return "str";
    case Value::Kind::list: return "list";
    case Value::Kind::dict: return "dict";
    case Value::Kind::ns: return "Namespace";
    case Value::Kind::macro: return "Macro";
    case Value::Kind::builtin: return "function";
  }
  return "?";
}

Value value_from_json(const nlohmann::ordered_json& j) {
  using t = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case t::null: return Value::none_value();
    case t::boolean: return Value::boolean(j.get<bool>());
    case t::number_integer: return Value::integer(j.get<int64_t>());
    case t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      DF_CHECK(u <= uint64_t(INT64_MAX), "the integer %llu does not fit in 64 bits", (unsigned long long)u);
      return Value::integer(int64_t(u));
    }
    case t::number_float: return Value::floating(j.get<double>());
    case t::string: return Value::string(j.get<std::string>());
    case t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(value_from_json(e));
      return Value::make_list(std::move(l));
    }
    case t::object: {
      Dict d;
      d.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), value_from_json(it.value()));
      return Value::make_dict(std::move(d));
    }
    default: DF_FAIL("a JSON value of type %s cannot be passed to a chat template", j.type_name());
  }
}

bool value_truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined:
    case Value::Kind::none: return false;
    case Value::Kind::boolean: return v.b;
    case Value::Kind::integer: return v.i != 0;
    case Value::Kind::floating: return v.f != 0;
    case Value::Kind::string: return !v.s.empty();
    case Value::Kind::list: return !v.list->empty();
    case Value::Kind::dict: return !v.dict->empty();
    default: return true;
  }
}

double value_as_double(const Value& v) {
  if (v.kind == Value::Kind::floating) return v.f;
  if (v.kind == Value::Kind::boolean) return v.b ? 1 : 0;
  return double(v.i);
}

bool value_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::floating && b.kind != Value::Kind::floating)
      return (a.kind == Value::Kind::boolean ? int64_t(a.b) : a.i) == (b.kind == Value::Kind::boolean ? int64_t(b.b) : b.i);
    return value_as_double(a) == value_as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::undefined:
    case Value::Kind::none: return true;
    case Value::Kind::string: return a.s == b.s;
    case Value::Kind::list:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!value_equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::Kind::dict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& kv : *a.dict) {
        const Value* o = b.find(kv.first);
        if (!o || !value_equal(kv.second, *o)) return false;
      }
      return true;
    case Value::Kind::ns: return a.dict == b.dict;
    case Value::Kind::macro: return a.macro == b.macro;
    case Value::Kind::builtin: return a.s == b.s;
    default: return false;
  }
}

bool value_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::integer && b.kind == Value::Kind::integer) return a.i < b.i;
    return value_as_double(a) < value_as_double(b);
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;  // UTF-8 byte order is code point order
  if (a.kind == Value::Kind::list && b.kind == Value::Kind::list) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k)
      if (!value_equal((*a.list)[k], (*b.list)[k])) return value_less((*a.list)[k], (*b.list)[k]);
    return a.list->size() < b.list->size();
  }
  DF_FAIL("'<' not supported between instances of '%s' and '%s'", value_type_name(a), value_type_name(b));
}

namespace {

// repr(float) in Python 3: the shortest digits that read back as the same double, in fixed notation when the
// decimal exponent is in [-4, 16), else as d.ddde±XX.
std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  for (int prec = 0; prec < 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string e(buf);
  const size_t epos = e.find('e');
  const int exp10 = std::atoi(e.c_str() + epos + 1);
  std::string mant = e.substr(0, epos);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = neg ? "-" : "";
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 < 0) {
      out += "0." + std::string(size_t(-exp10 - 1), '0') + digits;
    } else if (size_t(exp10) + 1 >= digits.size()) {
      out += digits + std::string(size_t(exp10) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, size_t(exp10) + 1) + "." + digits.substr(size_t(exp10) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  std::snprintf(buf, sizeof buf, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
  return out + buf;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

// str.isprintable for the code points a chat is likely to hold: controls, the Latin-1 gap, format characters
// and the non-space separators print as escapes in repr(); other code points print as themselves.
bool py_isprintable(char32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if ((c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F)) return false;
  if (c == 0x1680 || c == 0x3000 || c == 0xFEFF || (c >= 0xD800 && c <= 0xDFFF) || (c >= 0xFFF9 && c <= 0xFFFB))
    return false;
  return true;
}

std::string str_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  char buf[16];
  for (char32_t c : utf8_decode(s)) {
    if (c == char32_t(q) || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (py_isprintable(c)) {
      append_utf8(out, c);
    } else {
      std::snprintf(buf, sizeof buf, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x", unsigned(c));
      out += buf;
    }
  }
  return out + q;
}

void tojson_into(const Value& v, std::string& out) {
  switch (v.kind) {
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += v.b ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(v.i); return;
    case Value::Kind::floating:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : float_repr(v.f);
      return;
    case Value::Kind::string: {
      out += '"';
      char buf[8];
      for (unsigned char c : v.s) {
        switch (c) {
          case '"': out += "\\\""; break;
          case '\\': out += "\\\\"; break;
          case '\n': out += "\\n"; break;
          case '\r': out += "\\r"; break;
          case '\t': out += "\\t"; break;
          case '\b': out += "\\b"; break;
          case '\f': out += "\\f"; break;
          default:
            if (c < 0x20) {
              std::snprintf(buf, sizeof buf, "\\u%04x", c);
              out += buf;
            } else {
              out += char(c);
            }
        }
      }
      out += '"';
      return;
    }
    case Value::Kind::list:
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        tojson_into((*v.list)[k], out);
      }
      out += ']';
      return;
    case Value::Kind::dict:
      out += '{';
      for (size_t k = 0; k < v.dict->size(); ++k) {
        if (k) out += ", ";
        tojson_into(Value::string((*v.dict)[k].first), out);
        out += ": ";
        tojson_into((*v.dict)[k].second, out);
      }
      out += '}';
      return;
    default: DF_FAIL("Object of type %s is not JSON serializable", value_type_name(v));
  }
}

}  // namespace

std::string value_repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::string: return str_repr(v.s);
    case Value::Kind::list: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + value_repr((*v.list)[k]);
      return out + (v.tuple ? (v.list->size() == 1 ? ",)" : ")") : "]");
    }
    case Value::Kind::dict: {
      std::string out = "{";
      for (size_t k = 0; k < v.dict->size(); ++k)
        out += (k ? ", " : "") + str_repr((*v.dict)[k].first) + ": " + value_repr((*v.dict)[k].second);
      return out + "}";
    }
    default: return value_str(v);
  }
}

std::string value_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return "";
    case Value::Kind::none: return "None";
    case Value::Kind::boolean: return v.b ? "True" : "False";
    case Value::Kind::integer: return std::to_string(v.i);
    case Value::Kind::floating: return float_repr(v.f);
    case Value::Kind::string: return v.s;
    case Value::Kind::list:
    case Value::Kind::dict: return value_repr(v);
    case Value::Kind::ns: {
      std::string out = "<Namespace {";
      for (size_t k = 0; k < v.dict->size(); ++k)
        out += (k ? ", " : "") + str_repr((*v.dict)[k].first) + ": " + value_repr((*v.dict)[k].second);
      return out + "}>";
    }
    case Value::Kind::macro: return "<Macro>";
    case Value::Kind::builtin: return "<function " + v.s + ">";
  }
  return "";
}

std::string value_tojson(const Value& v) {
  std::string out;
  tojson_into(v, out);
  return out;
}

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    DF_CHECK(n > 0 && k + size_t(n) <= s.size(), "invalid UTF-8 at byte %zu of a template string", k);
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int j = 1; j < n; ++j) {
      const unsigned char cc = static_cast<unsigned char>(s[k + size_t(j)]);
      DF_CHECK((cc >> 6) == 2, "invalid UTF-8 at byte %zu of a template string", k);
      cp = (cp << 6) | (cc & 0x3F);
    }
    out += cp;
    k += size_t(n);
  }
  return out;
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string py_strip(const std::string& s, const std::string& chars, bool left, bool right) {
  const std::u32string u = utf8_decode(s), set = utf8_decode(chars);
  auto strip_it = [&](char32_t c) { return chars.empty() ? py_isspace(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return utf8_encode(u.substr(b, e - b));
}

}  // namespace df::jinja
