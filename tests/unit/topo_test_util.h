// Shared by the topo unit tests: fixture paths and a check that a call throws df::Error whose message
// names what the user must fix (a line number, an option), not just that it threw.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace df {

inline std::string topo_fixture(const std::string& name) {
  return std::string(DF_SOURCE_DIR) + "/tests/fixtures/sysfs/" + name;
}

template <typename F>
void expect_error_with(F&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected df::Error containing '" << needle << "', nothing thrown";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

}  // namespace df
