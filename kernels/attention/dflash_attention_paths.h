// The DFlash attention kernels' paths as the A/B environment switches select them
// (kernels/attention/dflash_attention.cu reads the variables on every call; README: environment switches of the CUDA
// backend): one list for test_dflash_attention, which checks every path against the CPU oracle, and
// bench_kernels dflash, which checks and times every path, so that a new switch is tested and measured once
// it is listed here.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <string>

namespace df {

struct DFlashAttnPath {
  const char* name;      // how the test and the bench name the path
  const char* settings;  // "VAR=value" items separated by spaces (nullptr: the default, every variable unset)
  bool wgmma;            // the path differs from the default only where the wgmma kernels run
};

inline constexpr DFlashAttnPath kDFlashAttnPaths[] = {
    {"default", nullptr, false},
    {"mma.sync", "DFLASH_DFA=mma", false},
    {"wgmma mask always", "DFLASH_DFA_FAST=0", true},
    {"wgmma two tile loads", "DFLASH_DFA_PAIR=0", true},
    {"wgmma cp.async K/V", "DFLASH_DFA_TMA=0", true},
    {"wgmma cp.async Q/dO", "DFLASH_DFA_KV_TMA=0", true},
    {"wgmma dk/dv items one at a time", "DFLASH_DFA_KV_PIPE=0", true},
    {"dk/dv tiles kv head by kv head", "DFLASH_DFA_KV_ORDER=head", false},
    {"dk/dv tiles in tile order over all heads", "DFLASH_DFA_KV_ORDER=tile", false},
    {"dq pass after the dk/dv pass", "DFLASH_DFA_OVERLAP=0", false},
    {"wgmma own rows' dk/dv in the dk/dv pass", "DFLASH_DFA_OWN=kv", true},
    {"session 19 order: head order, own rows in dk/dv, no overlap",
     "DFLASH_DFA_KV_ORDER=head DFLASH_DFA_OWN=kv DFLASH_DFA_OVERLAP=0", false},
};

// Every variable of the list, each once.
inline constexpr const char* kDFlashAttnVars[] = {
    "DFLASH_DFA",         "DFLASH_DFA_FAST",     "DFLASH_DFA_PAIR",    "DFLASH_DFA_TMA", "DFLASH_DFA_KV_TMA",
    "DFLASH_DFA_KV_PIPE", "DFLASH_DFA_KV_ORDER", "DFLASH_DFA_OVERLAP", "DFLASH_DFA_OWN"};

// Whether the n characters at `a` are the name v.
constexpr bool dfa_names(const char* a, int n, const char* v) {
  for (int i = 0; i < n; ++i)
    if (v[i] != a[i]) return false;
  return v[n] == '\0';
}
// Whether every path's settings are "VAR=value" items of listed variables (dflash_attn_select_path unsets
// only those).
constexpr bool dfa_paths_listed() {
  for (const DFlashAttnPath& p : kDFlashAttnPaths) {
    for (const char* s = p.settings; s && *s;) {
      int n = 0;
      while (s[n] && s[n] != '=' && s[n] != ' ') ++n;
      if (s[n] != '=' || n == 0) return false;
      bool found = false;
      for (const char* v : kDFlashAttnVars) found = found || dfa_names(s, n, v);
      if (!found) return false;
      s += n + 1;
      while (*s && *s != ' ') ++s;
      while (*s == ' ') ++s;
    }
  }
  return true;
}
static_assert(dfa_paths_listed(), "a DFlash attention path sets a variable missing from kDFlashAttnVars");

// Selects `path` alone: its settings made, every other variable of the list unset.
inline void dflash_attn_select_path(const DFlashAttnPath& path) {
  for (const char* v : kDFlashAttnVars) unsetenv(v);
  const std::string s = path.settings ? path.settings : "";
  for (size_t at = 0; at < s.size();) {
    const size_t end = std::min(s.find(' ', at), s.size()), eq = s.find('=', at);
    if (eq < end) setenv(s.substr(at, eq - at).c_str(), s.substr(eq + 1, end - eq - 1).c_str(), 1);
    at = end + 1;
  }
}

}  // namespace df
