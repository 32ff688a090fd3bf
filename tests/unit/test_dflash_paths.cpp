// The DFlash attention paths' table (kernels/attention/dflash_attention_paths.h) that test_dflash_attention and
// bench_kernels dflash walk: selecting a path sets exactly its settings and unsets every other listed
// variable, so no path runs under a setting left over from the one before.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "kernels/attention/dflash_attention_paths.h"

using namespace df;

namespace {

std::map<std::string, std::string> listed_env() {
  std::map<std::string, std::string> set;
  for (const char* v : kDFlashAttnVars)
    if (const char* e = std::getenv(v)) set[v] = e;
  return set;
}

}  // namespace

TEST(DFlashAttnPaths, SelectingAPathSetsItsSettingsAlone) {
  setenv("DFLASH_DFA_FAST", "0", 1);  // left over from "before": the next selection must clear it
  std::map<std::string, std::string> want;
  dflash_attn_select_path(kDFlashAttnPaths[0]);
  EXPECT_EQ(listed_env(), want) << "the default path sets no variable";
  bool combined = false;
  for (const DFlashAttnPath& p : kDFlashAttnPaths) {
    dflash_attn_select_path(p);
    want.clear();
    const std::string s = p.settings ? p.settings : "";
    int items = 0;
    for (size_t at = 0; at < s.size(); ++items) {
      const size_t end = s.find(' ', at) == std::string::npos ? s.size() : s.find(' ', at);
      const size_t eq = s.find('=', at);
      ASSERT_LT(eq, end) << p.name << ": item without '=' in \"" << s << "\"";
      want[s.substr(at, eq - at)] = s.substr(eq + 1, end - eq - 1);
      at = end + 1;
    }
    combined = combined || items > 1;
    EXPECT_EQ(listed_env(), want) << p.name;
  }
  EXPECT_TRUE(combined) << "the table keeps one path that combines settings";
  dflash_attn_select_path(kDFlashAttnPaths[0]);
  EXPECT_TRUE(listed_env().empty());
}
