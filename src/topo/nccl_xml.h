// NCCL topology XML (the file NCCL_TOPO_FILE names) that puts each GPU under its true NUMA node, for VMs
// whose PCI devices report numa_node -1 and would otherwise leave NCCL guessing CPU affinity.
#pragma once
#include <string>
#include <vector>

#include "topo/topo.h"

namespace df {

// One <cpu numaid affinity> per NUMA id the GPUs use, each holding the <pci busid class vendor> of its
// GPUs. NCCL reads the file, keeps this placement, and fills in the rest (link speeds, NVLink, sm) itself.
// A NUMA node the host does not list gets every cpu as affinity, with a note in `warnings`.
std::string nccl_xml_format(const HostTopo& topo, std::vector<std::string>& warnings);

// Linux cpumap text ("ffffffff,00000000", 32-bit groups, most significant first), the affinity NCCL expects.
std::string nccl_xml_cpumask(const std::vector<int>& cpus);

}  // namespace df
