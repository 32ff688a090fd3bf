// Physical-memory bound for size arguments (see host_memory.h).
#include "core/host_memory.h"

#include <unistd.h>

#include "core/error.h"

namespace df {

double host_memory_bytes() {
  return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
}

void host_memory_check(double need_bytes, const std::string& what, const std::string& hint) {
  const double have = host_memory_bytes();
  DF_CHECK(need_bytes <= have, "%s needs %.3g GiB of host memory but this machine has %.3g GiB; HINT: %s",
           what.c_str(), need_bytes / double(1ull << 30), have / double(1ull << 30), hint.c_str());
}

}  // namespace df
