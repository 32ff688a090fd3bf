// Errors: library code throws df::Error carrying file:line and the failing call; the binary's main catches
// it, prefixes rank and host, and calls MPI_Abort so no other rank waits forever in a collective.
#pragma once
#include <stdexcept>
#include <string>

#include "core/strfmt.h"

namespace df {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Builds "file:line: message" and throws df::Error.
[[noreturn]] void error_throw(const char* file, int line, const std::string& msg);

}  // namespace df

// DF_CHECK(cond, "fmt", args...): throws with the condition text and the formatted message.
#define DF_CHECK(cond, ...)                                                                         \
  do {                                                                                              \
    if (!(cond)) ::df::error_throw(__FILE__, __LINE__, ::df::strfmt(__VA_ARGS__) + " [" #cond "]"); \
  } while (0)
#define DF_FAIL(...) ::df::error_throw(__FILE__, __LINE__, ::df::strfmt(__VA_ARGS__))
