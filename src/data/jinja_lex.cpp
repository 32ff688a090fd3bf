// The lexer of the Jinja interpreter (data/jinja_lex.h): template text to chunks with jinja2's whitespace rules,
// and a tag's source to tokens with Python's string-literal escapes.
#include "data/jinja_lex.h"

#include <cctype>
#include <cstdlib>

#include "core/error.h"
#include "data/jinja_value.h"

namespace df::jinja {

namespace {

std::string rstrip_space(const std::string& s) { return py_strip(s, "", false, true); }

// Python's unicode-escape decoding of a string literal's body (what jinja2 applies to it).
std::string unescape(const std::string& body, const std::string& where) {
  std::string out;
  for (size_t k = 0; k < body.size(); ++k) {
    if (body[k] != '\\' || k + 1 >= body.size()) {
      out += body[k];
      continue;
    }
    const char c = body[++k];
    auto hex = [&](int n) {
      const std::string h = body.substr(k + 1, size_t(n));
      DF_CHECK(h.size() == size_t(n) && h.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos,
               "%s: bad \\%c escape in a string literal", where.c_str(), c);
      k += size_t(n);
      return char32_t(std::strtoul(h.c_str(), nullptr, 16));
    };
    switch (c) {
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': out += utf8_encode(std::u32string(1, hex(2))); break;
      case 'u': out += utf8_encode(std::u32string(1, hex(4))); break;
      case 'U': out += utf8_encode(std::u32string(1, hex(8))); break;
      default:
        if (c >= '0' && c <= '7') {
          int v = 0, n = 0;
          for (--k; n < 3 && k + 1 < body.size() && body[k + 1] >= '0' && body[k + 1] <= '7'; ++n) v = v * 8 + (body[++k] - '0');
          out += utf8_encode(std::u32string(1, char32_t(v)));
        } else {
          DF_CHECK(c != 'N', "%s: \\N{...} escapes are not supported", where.c_str());
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

}  // namespace

// jinja2's lexer.py tokeniter: `line_starting` is whether the previous tag's match ended with a newline.
std::vector<Chunk> jinja_split_chunks(const std::string& raw, const std::string& name) {
  std::string src;
  src.reserve(raw.size());
  for (size_t k = 0; k < raw.size(); ++k) {
    if (raw[k] == '\r') {
      src += '\n';
      if (k + 1 < raw.size() && raw[k + 1] == '\n') ++k;
    } else {
      src += raw[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();  // keep_trailing_newline=False
  std::vector<Chunk> out;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;
  auto count_lines = [&](size_t from, size_t to) {
    for (size_t k = from; k < to; ++k) line += src[k] == '\n';
  };
  while (pos <= src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' &&
           src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open == std::string::npos || open + 1 >= src.size()) {
      if (pos < src.size()) out.push_back({Chunk::Kind::text, src.substr(pos), line});
      break;
    }
    const char type = src[open + 1];
    const char sign = open + 2 < src.size() && (src[open + 2] == '-' || src[open + 2] == '+') ? src[open + 2] : 0;
    std::string text = src.substr(pos, open - pos);
    if (sign == '-') {
      text = rstrip_space(text);
    } else if (sign != '+' && type != '{') {
      const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
          text.find_first_not_of(" \t", l_pos) == std::string::npos)
        text.resize(l_pos);
    }
    const int text_line = line;
    count_lines(pos, open);
    if (!text.empty()) out.push_back({Chunk::Kind::text, text, text_line});
    const int tag_line = line;
    const std::string close = type == '{' ? "}}" : type == '%' ? "%}" : "#}";
    size_t k = open + 2 + (sign ? 1 : 0), end = std::string::npos;
    char quote = 0;
    for (; k < src.size(); ++k) {
      const char c = src[k];
      if (type != '#' && quote) {
        if (c == '\\') ++k;
        else if (c == quote) quote = 0;
        continue;
      }
      if (type != '#' && (c == '\'' || c == '"')) {
        quote = c;
        continue;
      }
      if (src.compare(k, 2, close) == 0) {
        end = k;
        break;
      }
    }
    DF_CHECK(end != std::string::npos, "%s line %d: '%c%c' is never closed with '%s'", name.c_str(), tag_line, '{',
             type, close.c_str());
    size_t inner_end = end;
    const char close_sign =
        end > open + 2 + (sign ? 1 : 0) && (src[end - 1] == '-' || src[end - 1] == '+') ? src[end - 1] : 0;
    if (close_sign) --inner_end;
    const size_t inner_begin = open + 2 + (sign ? 1 : 0);
    if (type != '#')
      out.push_back({type == '{' ? Chunk::Kind::var : Chunk::Kind::block, src.substr(inner_begin, inner_end - inner_begin),
                     tag_line});
    count_lines(open, end + 2);
    pos = end + 2;
    line_starting = false;
    if (close_sign == '-') {
      const std::u32string rest = utf8_decode(src.substr(pos));
      size_t n = 0, bytes = 0;
      while (n < rest.size() && py_isspace(rest[n])) {
        bytes += utf8_encode(rest.substr(n, 1)).size();
        ++n;
      }
      count_lines(pos, pos + bytes);
      if (bytes > 0) line_starting = src[pos + bytes - 1] == '\n';
      pos += bytes;
    } else if (close_sign != '+' && type != '{' && pos < src.size() && src[pos] == '\n') {
      ++pos;
      ++line;
      line_starting = true;
    }
  }
  return out;
}


std::vector<Tok> jinja_tokenize(const std::string& s, const std::string& where) {
  static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=",
                               "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
  std::vector<Tok> out;
  size_t k = 0;
  while (k < s.size()) {
    const char c = s[k];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++k;
      continue;
    }
    Tok t;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = k;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      t.t = Tok::T::name;
      t.s = s.substr(k, e - k);
      k = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = k;
      while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      bool is_float = false;
      if (e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1])) &&
          !(out.size() && out.back().t == Tok::T::op && out.back().s == ".")) {
        is_float = true;
        for (++e; e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_');) ++e;
      }
      if (e < s.size() && (s[e] == 'e' || s[e] == 'E')) {
        size_t x = e + 1;
        if (x < s.size() && (s[x] == '+' || s[x] == '-')) ++x;
        if (x < s.size() && std::isdigit(static_cast<unsigned char>(s[x]))) {
          is_float = true;
          for (e = x; e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]));) ++e;
        }
      }
      std::string num;
      for (size_t j = k; j < e; ++j)
        if (s[j] != '_') num += s[j];
      if (is_float) {
        t.t = Tok::T::floating;
        t.f = std::strtod(num.c_str(), nullptr);
      } else {
        t.t = Tok::T::integer;
        t.i = std::strtoll(num.c_str(), nullptr, 10);
      }
      k = e;
    } else if (c == '\'' || c == '"') {
      size_t e = k + 1;
      while (e < s.size() && s[e] != c) e += s[e] == '\\' ? 2 : 1;
      DF_CHECK(e < s.size(), "%s: unterminated string literal", where.c_str());
      t.t = Tok::T::str;
      t.s = unescape(s.substr(k + 1, e - k - 1), where);
      k = e + 1;
    } else {
      bool found = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (s.compare(k, n, op) == 0) {
          t.t = Tok::T::op;
          t.s = op;
          k += n;
          found = true;
          break;
        }
      }
      DF_CHECK(found, "%s: unexpected character '%c'", where.c_str(), c);
    }
    out.push_back(std::move(t));
  }
  out.push_back(Tok{});
  return out;
}

}  // namespace df::jinja
