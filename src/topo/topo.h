// GPU / NUMA / CPU discovery for one host: the facts every placement decision (rankfile, NCCL topology XML)
// is derived from. Read from NVML when the driver is present, else from sysfs, which tests point at fixture
// trees (tests/fixtures/sysfs/) so placement can be checked for machines this build host is not.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace df {

struct GpuInfo {
  int index = 0;       // position in PCI bus order, which is CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID
  std::string bus_id;  // "0000:18:00.0", lower case, as sysfs and NCCL spell it
  std::string pci_class;        // "0x030200"
  std::string name;             // from NVML; empty when read from sysfs
  int numa = -1;                // -1: unknown (VMs commonly hide the PCI device's NUMA node)
  std::vector<int> local_cpus;  // the device's local_cpulist
  uint64_t memory_bytes = 0;    // total device memory from NVML; 0 when read from sysfs
};

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;  // OS cpu ids, hyperthread siblings included
};

struct HostTopo {
  std::string host;
  std::string source;  // "nvml" or "sysfs <root>"
  std::vector<GpuInfo> gpus;
  std::vector<NumaNode> numa_nodes;
  std::vector<int>
      all_cpus;  // every online cpu: the binding of last resort when a GPU's NUMA node is unknown
  std::map<int, int> core_of_cpu;  // cpu id -> first cpu of its SMT sibling set (the core Open MPI binds to)
  std::vector<std::string> warnings;
};

// "0-3,8,10-11" <-> {0,1,2,3,8,10,11}. Parsing throws naming `what` (a file or option) on malformed input.
std::vector<int> topo_parse_cpulist(const std::string& text, const std::string& what);
std::string topo_format_cpulist(const std::vector<int>& cpus);

// Reads `<root>/bus/pci/devices/*` (GPUs: vendor 0x10de, class 0x0300xx or 0x0302xx) and
// `<root>/devices/system/{node,cpu}`. Root "/sys" is the live machine.
HostTopo topo_discover_sysfs(const std::string& root, const std::string& host);

// The live machine: GPU list from NVML (dlopen libnvidia-ml.so.1) when it loads, NUMA and cpus from /sys.
HostTopo topo_discover_local(const std::string& host);

// The short host name of this machine (what Open MPI rankfiles and SLURM node lists use).
std::string topo_local_hostname();

// Overrides each GPU's NUMA node from a map "0-3:1,4-7:0" (GPU index ranges : NUMA id), for VMs whose
// PCI devices report -1. Every GPU of the host must be covered; throws otherwise.
void topo_apply_numa_map(HostTopo& topo, const std::string& map_text);

// Cpus of NUMA node `id`, empty when the host does not expose that node.
const NumaNode* topo_find_numa(const HostTopo& topo, int id);

}  // namespace df
