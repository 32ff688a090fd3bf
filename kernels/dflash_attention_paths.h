// The DFlash attention kernels' paths as the A/B environment switches select them
// (kernels/dflash_attention.cu reads the variables on every call; README: environment switches of the CUDA
// backend): one list for test_dflash_attention, which checks every path against the CPU oracle, and
// bench_kernels dflash, which checks and times every path, so that a new switch is tested and measured once
// it is listed here.
#pragma once
#include <cstdlib>

namespace df {

struct DFlashAttnPath {
  const char* name;   // how the test and the bench name the path
  const char* var;    // the variable that selects it (nullptr: the default, every variable unset)
  const char* value;  // its value
  bool wgmma;         // the path differs from the default only where the wgmma kernels run
};

inline constexpr DFlashAttnPath kDFlashAttnPaths[] = {
    {"default", nullptr, nullptr, false},
    {"mma.sync", "DFLASH_DFA", "mma", false},
    {"wgmma mask always", "DFLASH_DFA_FAST", "0", true},
    {"wgmma two tile loads", "DFLASH_DFA_PAIR", "0", true},
    {"wgmma cp.async K/V", "DFLASH_DFA_TMA", "0", true},
    {"wgmma cp.async Q/dO", "DFLASH_DFA_KV_TMA", "0", true},
    {"wgmma dk/dv items one at a time", "DFLASH_DFA_KV_PIPE", "0", true},
    {"dk/dv tiles in tile order", "DFLASH_DFA_KV_ORDER", "tile", false},
    {"dq pass in the dk/dv tail", "DFLASH_DFA_OVERLAP", "1", false},
    {"wgmma own rows' dk/dv in the dq pass", "DFLASH_DFA_OWN", "dq", true},
};

// Every variable of the list, each once.
inline constexpr const char* kDFlashAttnVars[] = {
    "DFLASH_DFA",         "DFLASH_DFA_FAST",     "DFLASH_DFA_PAIR",    "DFLASH_DFA_TMA", "DFLASH_DFA_KV_TMA",
    "DFLASH_DFA_KV_PIPE", "DFLASH_DFA_KV_ORDER", "DFLASH_DFA_OVERLAP", "DFLASH_DFA_OWN"};

constexpr bool dfa_same(const char* a, const char* b) {
  while (*a && *a == *b) ++a, ++b;
  return *a == *b;
}
// Whether every path's variable is one of kDFlashAttnVars (dflash_attn_select_path unsets only those).
constexpr bool dfa_paths_listed() {
  for (const DFlashAttnPath& p : kDFlashAttnPaths) {
    bool found = p.var == nullptr;
    for (const char* v : kDFlashAttnVars) found = found || (p.var && dfa_same(p.var, v));
    if (!found) return false;
  }
  return true;
}
static_assert(dfa_paths_listed(), "a DFlash attention path's variable is missing from kDFlashAttnVars");

// Selects `path` alone: its variable set, every other one of the list unset.
inline void dflash_attn_select_path(const DFlashAttnPath& path) {
  for (const char* v : kDFlashAttnVars) unsetenv(v);
  if (path.var) setenv(path.var, path.value, 1);
}

}  // namespace df
