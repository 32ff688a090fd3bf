// Wall-clock intervals for the timing lines the loops report.
#pragma once
#include <chrono>

namespace df {

// Seconds from `t0` to now on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace df
