// printf-style formatting into std::string (g++ 12 has no std::format).
#pragma once
#include <cstdarg>
#include <string>

namespace df {

std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vstrfmt(const char* fmt, va_list ap);

}  // namespace df
