// The CUDA kernels' A/B environment switches (README: environment switches of the CUDA backend): host code
// that picks a kernel form asks whether a variable holds one value.
#pragma once
#include <cstdlib>
#include <cstring>

namespace df {

// Whether environment variable `name` is set to exactly `value`.
inline bool env_is(const char* name, const char* value) {
  const char* e = std::getenv(name);
  return e && std::strcmp(e, value) == 0;
}

}  // namespace df
