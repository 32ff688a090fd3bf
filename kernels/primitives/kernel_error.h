// How kernels/ code throws: df::Error "file:line: message", header-only, because the kernels library links
// after the src/ one and cannot call into it (error_throw, strfmt) without being listed twice.
#pragma once
#include <string>

#include "core/error.h"

namespace df {

[[noreturn]] inline void kernel_throw(const char* file, int line, const std::string& msg) {
  throw Error(std::string(file) + ":" + std::to_string(line) + ": " + msg);
}

}  // namespace df
