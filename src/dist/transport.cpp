// Transport choice; see transport.h.
#include "dist/transport.h"

#include <map>
#include <utility>

#include "core/error.h"
#include "core/strfmt.h"

namespace df {

const char* transport_name(Transport t) { return t == Transport::nccl ? "nccl" : "mpi"; }

Transport transport_choose(const std::string& setting, const std::vector<std::string>& hosts,
                           const std::vector<int>& gpus, bool nccl_built, std::string* why) {
  DF_CHECK(setting == "auto" || setting == "nccl" || setting == "mpi",
           "pipeline.transport = \"%s\": must be \"auto\", \"nccl\" or \"mpi\"", setting.c_str());
  std::string reason;
  bool nccl_ok = nccl_built;
  if (!nccl_built) reason = "this binary was built without CUDA/NCCL";
  std::map<std::pair<std::string, int>, int> owner;
  for (size_t r = 0; r < gpus.size() && nccl_ok; ++r) {
    if (gpus[r] < 0) {
      nccl_ok = false;
      reason = strfmt("rank %zu runs on the CPU", r);
      break;
    }
    auto [it, fresh] = owner.emplace(std::make_pair(hosts[r], gpus[r]), int(r));
    if (!fresh) {
      nccl_ok = false;
      reason = strfmt("ranks %d and %zu share GPU %d of %s (NCCL refuses two ranks on one GPU)", it->second, r,
                      gpus[r], hosts[r].c_str());
    }
  }
  if (setting == "nccl")
    DF_CHECK(nccl_ok, "pipeline.transport = \"nccl\" cannot work: %s; HINT: one GPU per rank, or \"auto\"/\"mpi\"",
             reason.c_str());
  const Transport t = setting == "mpi" ? Transport::mpi : setting == "nccl" ? Transport::nccl
                                                         : (nccl_ok ? Transport::nccl : Transport::mpi);
  if (why)
    *why = setting == "auto" ? (t == Transport::nccl ? "auto: every rank owns a distinct GPU" : "auto: " + reason)
                             : "pipeline.transport = \"" + setting + "\"";
  return t;
}

}  // namespace df
