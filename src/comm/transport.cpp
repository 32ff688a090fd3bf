// Transport choice; see transport.h.
#include "comm/transport.h"

#include <map>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/strfmt.h"

namespace df {

namespace {

// "0, 1, 2": ranks or GPU ids, in order.
template <class Ints>
std::string int_list(const Ints& values) {
  std::string s;
  for (int v : values) s += strfmt("%s%d", s.empty() ? "" : ", ", v);
  return s;
}

}  // namespace

const char* transport_name(Transport t) { return t == Transport::nccl ? "nccl" : "mpi"; }

TransportChoice transport_choose(const std::string& setting, const TransportRanks& ranks, bool nccl_built) {
  DF_CHECK(setting == "auto" || setting == "nccl" || setting == "mpi",
           "pipeline.transport = \"%s\": must be \"auto\", \"nccl\" or \"mpi\"", setting.c_str());
  const size_t n = ranks.gpus.size();
  DF_CHECK(ranks.hosts.size() == n && (ranks.host_ids.empty() || ranks.host_ids.size() == n),
           "transport choice: %zu hosts and %zu NCCL_HOSTIDs for %zu ranks (internal error)", ranks.hosts.size(),
           ranks.host_ids.size(), n);
  auto host_id = [&](size_t r) { return ranks.host_ids.empty() ? std::string() : ranks.host_ids[r]; };
  TransportChoice c;
  std::string reason;       // why NCCL cannot work at all ("" if it can)
  std::string shared;       // why NCCL works only in the shared-GPU test mode ("" if no GPU is shared)
  std::set<int> shared_gpus;
  if (!nccl_built) reason = "this binary was built without CUDA/NCCL";
  std::map<std::pair<std::string, int>, std::vector<int>> by_gpu;
  std::vector<int> on_cpu;
  for (size_t r = 0; r < n && reason.empty(); ++r) {
    if (ranks.gpus[r] < 0) on_cpu.push_back(int(r));
    by_gpu[{ranks.hosts[r], ranks.gpus[r]}].push_back(int(r));
  }
  if (on_cpu.size() == n && n > 1)
    reason = "every rank runs on the CPU";
  else if (on_cpu.size() == 1)
    reason = strfmt("rank %d runs on the CPU", on_cpu[0]);
  else if (!on_cpu.empty())
    reason = strfmt("ranks %s run on the CPU", int_list(on_cpu).c_str());
  for (const auto& [where, members] : by_gpu) {
    if (!reason.empty()) break;
    if (members.size() < 2) continue;
    // NCCL tells hosts apart by NCCL_HOSTID: ranks on one GPU need one id each, or NCCL sees a duplicate GPU.
    std::map<std::string, int> id_owner;
    for (int r : members) {
      const std::string id = host_id(size_t(r));
      auto [it, fresh] = id_owner.emplace(id, r);
      if (id.empty() || !fresh) {
        // The pair to name: this rank and one it shares the GPU with (the one with the same id).
        const int a = !id.empty() ? it->second : r == members[0] ? r : members[0];
        const int b = !id.empty() ? r : r == members[0] ? members[1] : r;
        reason = strfmt("ranks %d and %d share GPU %d of %s (NCCL refuses two ranks on one GPU%s)", a, b,
                        where.second, where.first.c_str(),
                        id.empty() ? "" : strfmt("; both have NCCL_HOSTID=%s", id.c_str()).c_str());
        break;
      }
    }
    if (reason.empty()) {
      shared_gpus.insert(where.second);
      if (shared.empty())
        shared = strfmt("ranks %s share GPU %d of %s", int_list(members).c_str(), where.second,
                        where.first.c_str());
    }
  }
  // Distinct GPUs of one host behind distinct ids: NCCL would treat them as separate hosts.
  std::map<std::string, std::map<std::string, int>> ids_on_host;
  for (size_t r = 0; r < n; ++r)
    if (!host_id(r).empty()) ids_on_host[ranks.hosts[r]].emplace(host_id(r), int(r));
  for (const auto& [host, ids] : ids_on_host) {
    std::set<int> gpus_with_ids;
    for (const auto& [id, r] : ids) gpus_with_ids.insert(ranks.gpus[size_t(r)]);
    if (gpus_with_ids.size() > 1 && c.warning.empty())
      c.warning = strfmt(
          "ranks of %s on %zu different GPUs carry %zu different NCCL_HOSTIDs: NCCL treats them as separate "
          "hosts and talks over the network between them, not NVLink or shared memory; HINT: unset "
          "NCCL_HOSTID outside the shared-GPU test mode (launch/nccl_hostid.sh)",
          host.c_str(), gpus_with_ids.size(), ids.size());
  }

  const bool nccl_ok = reason.empty();
  if (setting == "nccl")
    DF_CHECK(nccl_ok,
             "pipeline.transport = \"nccl\" cannot work: %s; HINT: one GPU per rank, or \"auto\"/\"mpi\"; to run "
             "NCCL on a shared GPU as a test, give every rank its own NCCL_HOSTID (launch/nccl_hostid.sh)",
             reason.c_str());
  if (setting == "mpi") {
    c.transport = Transport::mpi;
    c.why = "pipeline.transport = \"mpi\"";
  } else if (setting == "nccl") {
    c.transport = Transport::nccl;
    c.why = "pipeline.transport = \"nccl\"";
    if (!shared.empty()) {
      c.test_mode = strfmt("NCCL over sockets: ranks share GPU %s (test mode)", int_list(shared_gpus).c_str());
      c.why += strfmt("; %s: %s, each with its own NCCL_HOSTID; no interconnect speed", c.test_mode.c_str(),
                      shared.c_str());
    }
  } else if (nccl_ok && shared.empty()) {
    c.transport = Transport::nccl;
    c.why = "auto: every rank owns a distinct GPU";
  } else {
    c.transport = Transport::mpi;
    c.why = "auto: " + (nccl_ok ? shared + " (NCCL over a shared GPU is a test mode: transport \"nccl\")" : reason);
  }
  return c;
}

}  // namespace df
