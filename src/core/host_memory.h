// Up-front refusal of work whose host memory could never fit: a size argument with a typo (an extra digit in
// --max-len, a 27B model on the CPU) fails at once with the size, not after minutes of swapping or an OOM
// kill.
#pragma once
#include <string>

namespace df {

// This machine's physical memory in bytes (MemTotal).
double host_memory_bytes();

// Throws naming `what`, the bytes it needs and the machine's memory, plus `hint`, when need > physical
// memory.
void host_memory_check(double need_bytes, const std::string& what, const std::string& hint);

}  // namespace df
