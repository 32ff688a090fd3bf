// printf-style formatting into std::string (g++ 12 has no std::format).
#pragma once
#include <cstdarg>
#include <string>

namespace df {

std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vstrfmt(const char* fmt, va_list ap);

// The shortest decimal that reads back as the same float, as a double: a written config says 1e-06, not
// 9.99999997e-07, and two floats print alike (%.9g) only when they are equal.
double float_shortest_decimal(float f);

}  // namespace df
