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
  // The PCIe link the GPU can train to: the lower of its own and its upstream port's max_link_speed /
  // max_link_width in sysfs (the current figures drop at idle). 0: unknown.
  double pcie_gts = 0;  // GT/s a lane: 8 (PCIe 3.0), 16 (4.0), 32 (5.0), 64 (6.0)
  int pcie_width = 0;   // lanes
  int nvlinks = -1;     // active NVLinks from NVML; -1: unknown (read from sysfs)
};

// Whether the host's GPUs talk over NVLink: NVML's link states, or from sysfs an NVSwitch bridge (NVIDIA, PCI
// class 0x0680xx) on the bus. Sysfs cannot see an NVLink bridge between two cards: then `unknown`, which
// planning treats as PCIe (the slower path).
enum class NvlinkSeen { none, present, unknown };
const char* nvlink_seen_name(NvlinkSeen n);  // "none", "present", "unknown (sysfs: no NVSwitch seen)"

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
  NvlinkSeen nvlink = NvlinkSeen::unknown;
  std::vector<std::string> warnings;
};

// How the bytes between two GPUs of one host travel, as `nvidia-smi topo -m` names it: NV (NVLink), NODE
// (PCIe within one NUMA node, through its host bridges), SYS (PCIe across NUMA nodes, over the inter-socket
// link).
enum class GpuPath { nvlink, node, sys, unknown };
GpuPath topo_gpu_path(const HostTopo& topo, int gpu_a, int gpu_b);
const char* gpu_path_name(GpuPath p);

// Bytes a second one direction of the GPU's PCIe link carries after line encoding (8b/10b below 8 GT/s,
// 128b/130b from PCIe 3.0; PCIe 5.0 x16: 63.0 GB/s); 0 when the link is unknown. Protocol overhead takes
// more: measure the achieved figure (bench_grad_allreduce) before relying on it.
double topo_pcie_bytes_per_s(const GpuInfo& g);

// "PCIe 5.0 x16" (or "PCIe link unknown").
std::string topo_pcie_name(const GpuInfo& g);

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
