// Error construction and string formatting shared by every module.
#include "core/error.h"

#include <cstdio>
#include <vector>

#include "core/count_noun.h"

namespace df {

std::string vstrfmt(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap2);
  va_end(ap2);
  std::string out(n > 0 ? n : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), n + 1, fmt, ap);
  return out;
}

std::string strfmt(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrfmt(fmt, ap);
  va_end(ap);
  return s;
}

std::string count_noun(long long n, const char* one, const char* many) {
  if (n == 1) return strfmt("1 %s", one);
  return many ? strfmt("%lld %s", n, many) : strfmt("%lld %ss", n, one);
}

void error_throw(const char* file, int line, const std::string& msg) {
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/' && (p[1] == 's' || p[1] == 'k' || p[1] == 't' || p[1] == 'b')) base = p + 1;
  throw Error(strfmt("%s:%d: %s", base, line, msg.c_str()));
}

}  // namespace df
