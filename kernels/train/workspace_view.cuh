// The training launchers' check of the scratch they are handed and their typed views into it (domino_head.cu,
// dflash2_conv.cu, dflash2_selector.cu): the offsets come from the layout functions of train_workspace.h.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/error.h"

namespace df {

inline void workspace_check(const char* op, void* ws, size_t ws_bytes, size_t need) {
  DF_CHECK(ws && ws_bytes >= need && reinterpret_cast<uintptr_t>(ws) % 256 == 0,
           "%s: workspace %p of %zu bytes, needs %zu bytes 256-byte aligned (HINT: size it with the layout "
           "function of train_workspace.h, or the workspace function train_launchers.cuh names, and the same "
           "arguments)",
           op, ws, ws_bytes, need);
}

template <class T>
T* workspace_at(void* ws, size_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(ws) + off);
}

}  // namespace df
