// Writes the skeleton NCCL topology: <system version="1"> / <cpu numaid affinity arch> / <pci busid class
// vendor>. NCCL looks up each GPU's <pci> by bus id; one found under a <cpu> keeps that parent, and NCCL
// completes link widths, <gpu dev sm> and NVLinks from the driver. A <gpu dev> written here could name a
// different CUDA index than NCCL's own, so the file leaves it out.
#include "topo/nccl_xml.h"

#include <map>
#include <set>

#include "core/strfmt.h"

namespace df {

std::string nccl_xml_cpumask(const std::vector<int>& cpus) {
  int max_cpu = 0;
  for (int c : cpus) max_cpu = std::max(max_cpu, c);
  std::vector<unsigned> words(max_cpu / 32 + 1, 0u);
  for (int c : cpus) words[c / 32] |= 1u << (c % 32);
  std::string out;
  for (size_t i = words.size(); i-- > 0;) out += strfmt("%s%08x", out.empty() ? "" : ",", words[i]);
  return out;
}

std::string nccl_xml_format(const HostTopo& topo, std::vector<std::string>& warnings) {
#if defined(__aarch64__)
  const char* arch = "arm64";
#else
  const char* arch = "x86_64";
#endif
  std::map<int, std::vector<const GpuInfo*>> by_numa;
  for (const GpuInfo& g : topo.gpus) by_numa[g.numa].push_back(&g);
  std::string out = strfmt("<system version=\"1\" name=\"dflash_mpi %s\">\n", topo.host.c_str());
  for (const auto& [numa, gpus] : by_numa) {
    std::vector<int> cpus;
    if (const NumaNode* n = topo_find_numa(topo, numa)) cpus = n->cpus;
    if (cpus.empty()) {
      cpus = topo.all_cpus;
      warnings.push_back(strfmt("host %s lists no NUMA node %d: its <cpu> gets every cpu (%s) as affinity",
                                topo.host.c_str(), numa, topo_format_cpulist(cpus).c_str()));
    }
    out += strfmt("  <cpu numaid=\"%d\" affinity=\"%s\" arch=\"%s\">\n", numa, nccl_xml_cpumask(cpus).c_str(), arch);
    for (const GpuInfo* g : gpus) {
      out += strfmt("    <pci busid=\"%s\" class=\"%s\" vendor=\"0x10de\"/>\n", g->bus_id.c_str(),
                    g->pci_class.empty() ? "0x030200" : g->pci_class.c_str());
    }
    out += "  </cpu>\n";
  }
  out += "</system>\n";
  return out;
}

}  // namespace df
