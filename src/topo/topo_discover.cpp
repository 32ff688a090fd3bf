// Host discovery from sysfs (any root, so fixtures stand in for real machines) and from NVML, which is
// loaded with dlopen so the binary runs, and CI builds, on machines without the NVIDIA driver.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "topo/topo.h"

namespace df {

namespace fs = std::filesystem;

namespace {

// Whole file without the trailing newline; empty when the file does not exist.
std::string read_trimmed(const fs::path& p) {
  std::ifstream f(p);
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

int parse_int(const std::string& s, const std::string& what) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(s, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  DF_CHECK(used == s.size() && !s.empty(), "%s: expected an integer, got '%s'", what.c_str(), s.c_str());
  return v;
}

bool is_nvidia_gpu(const std::string& vendor, const std::string& pci_class) {
  // 0x0300xx: VGA controller, 0x0302xx: 3D controller (all data-centre GPUs).
  return vendor == "0x10de" && (pci_class.rfind("0x0300", 0) == 0 || pci_class.rfind("0x0302", 0) == 0);
}

// The NUMA nodes, the online cpus and the SMT core of every cpu.
void read_cpu_topology(const fs::path& root, HostTopo& topo) {
  fs::path node_dir = root / "devices/system/node";
  std::error_code ec;
  if (fs::is_directory(node_dir, ec)) {
    for (const auto& e : fs::directory_iterator(node_dir)) {
      std::string name = e.path().filename().string();
      if (name.rfind("node", 0) != 0 || name.size() == 4 ||
          !std::all_of(name.begin() + 4, name.end(),
                       [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        continue;
      NumaNode n;
      n.id = std::stoi(name.substr(4));
      fs::path list = e.path() / "cpulist";
      n.cpus = topo_parse_cpulist(read_trimmed(list), list.string());
      topo.numa_nodes.push_back(std::move(n));
    }
  }
  std::sort(topo.numa_nodes.begin(), topo.numa_nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  std::set<int> all;
  for (const NumaNode& n : topo.numa_nodes) all.insert(n.cpus.begin(), n.cpus.end());
  if (all.empty()) {
    fs::path online = root / "devices/system/cpu/online";
    for (int c : topo_parse_cpulist(read_trimmed(online), online.string())) all.insert(c);
  }
  topo.all_cpus.assign(all.begin(), all.end());
  if (topo.numa_nodes.empty()) topo.warnings.push_back(strfmt("%s: no NUMA nodes listed", node_dir.c_str()));
  for (int c : topo.all_cpus) {
    fs::path sib = root / strfmt("devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
    std::string text = read_trimmed(sib);
    std::vector<int> s = text.empty() ? std::vector<int>{c} : topo_parse_cpulist(text, sib.string());
    topo.core_of_cpu[c] = s.empty() ? c : s.front();
  }
}

// A PCIe device's max_link_speed in GT/s ("32.0 GT/s PCIe", older kernels "8 GT/s") and max_link_width; 0
// when the files are absent or say "Unknown".
void read_pcie_link(const fs::path& dev, double& gts, int& width) {
  gts = std::atof(read_trimmed(dev / "max_link_speed").c_str());
  width = std::atoi(read_trimmed(dev / "max_link_width").c_str());
}

// Fills NUMA node, local cpus and the PCIe link of a GPU from its sysfs PCI directory. On a live machine the
// directory is a link into the device tree, whose parent is the upstream port: the link trains to the lower
// of the two.
void read_gpu_locality(const fs::path& dev, GpuInfo& g) {
  std::string numa = read_trimmed(dev / "numa_node");
  g.numa = numa.empty() ? -1 : parse_int(numa, (dev / "numa_node").string());
  if (g.numa < -1) g.numa = -1;
  fs::path cpus = dev / "local_cpulist";
  g.local_cpus = topo_parse_cpulist(read_trimmed(cpus), cpus.string());
  read_pcie_link(dev, g.pcie_gts, g.pcie_width);
  std::error_code ec;
  const fs::path real = fs::canonical(dev, ec);
  double up_gts = 0;
  int up_width = 0;
  if (!ec) read_pcie_link(real.parent_path(), up_gts, up_width);
  if (up_gts > 0 && g.pcie_gts > 0) g.pcie_gts = std::min(g.pcie_gts, up_gts);
  if (up_width > 0 && g.pcie_width > 0) g.pcie_width = std::min(g.pcie_width, up_width);
}

bool is_nvswitch(const std::string& vendor, const std::string& pci_class) {
  return vendor == "0x10de" && pci_class.rfind("0x0680", 0) == 0;
}

void warn_unknown_numa(HostTopo& topo) {
  std::string ids;
  for (const GpuInfo& g : topo.gpus)
    if (g.numa < 0) ids += (ids.empty() ? "" : ",") + std::to_string(g.index);
  if (ids.empty()) return;
  topo.warnings.push_back(strfmt(
      "host %s: GPUs %s report numa_node -1 (unknown; usual inside VMs). Placement treats them as one group; "
      "if you know the real mapping, write it into an NCCL topology with `dflash_mpi topo nccl-xml --numa "
      "...`",
      topo.host.c_str(), ids.c_str()));
}

// NVML through dlopen: only the handful of entry points needed, declared here with their C ABI.
struct NvmlPciInfo {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
using NvmlDevice = void*;
struct NvmlMemory {
  unsigned long long total, free, used;
};

bool nvml_list_gpus(std::vector<GpuInfo>& gpus, std::string& why_not) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    why_not = "libnvidia-ml.so.1 not loadable";
    return false;
  }
  auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlShutdown"));
  auto count = reinterpret_cast<int (*)(unsigned*)>(dlsym(lib, "nvmlDeviceGetCount_v2"));
  auto handle = reinterpret_cast<int (*)(unsigned, NvmlDevice*)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  auto pci = reinterpret_cast<int (*)(NvmlDevice, NvmlPciInfo*)>(dlsym(lib, "nvmlDeviceGetPciInfo_v3"));
  auto name = reinterpret_cast<int (*)(NvmlDevice, char*, unsigned)>(dlsym(lib, "nvmlDeviceGetName"));
  auto memory = reinterpret_cast<int (*)(NvmlDevice, NvmlMemory*)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
  auto nvlink = reinterpret_cast<int (*)(NvmlDevice, unsigned, int*)>(dlsym(lib, "nvmlDeviceGetNvLinkState"));
  bool ok = init && shutdown && count && handle && pci && name;
  if (!ok) why_not = "libnvidia-ml.so.1 lacks the v2/v3 entry points";
  if (ok && init() != 0) {
    why_not = "nvmlInit_v2 failed (driver not loaded?)";
    ok = false;
  } else if (ok) {
    unsigned n = 0;
    ok = count(&n) == 0;
    for (unsigned i = 0; ok && i < n; ++i) {
      NvmlDevice d = nullptr;
      NvmlPciInfo info{};
      char buf[96] = {0};
      ok = handle(i, &d) == 0 && pci(d, &info) == 0;
      if (!ok) break;
      GpuInfo g;
      g.index = static_cast<int>(i);
      g.bus_id = strfmt("%04x:%02x:%02x.0", info.domain, info.bus, info.device);
      g.pci_class = "0x030200";
      if (name(d, buf, sizeof(buf)) == 0) g.name = buf;
      NvmlMemory mem{};
      if (memory && memory(d, &mem) == 0) g.memory_bytes = mem.total;
      if (nvlink) {
        // NVML_NVLINK_MAX_LINKS is 18; a GPU without NVLink answers NOT_SUPPORTED for link 0.
        g.nvlinks = 0;
        for (unsigned link = 0; link < 18; ++link) {
          int active = 0;
          if (nvlink(d, link, &active) == 0 && active) ++g.nvlinks;
        }
      }
      gpus.push_back(std::move(g));
    }
    if (!ok) why_not = "NVML device query failed";
    shutdown();
  }
  dlclose(lib);
  return ok;
}

}  // namespace

std::vector<int> topo_parse_cpulist(const std::string& text, const std::string& what) {
  std::set<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t dash = item.find('-');
    int lo = parse_int(item.substr(0, dash), what + " (cpu list '" + text + "')");
    int hi = dash == std::string::npos
                 ? lo
                 : parse_int(item.substr(dash + 1), what + " (cpu list '" + text + "')");
    DF_CHECK(lo >= 0 && lo <= hi, "%s: bad cpu range '%s' in '%s'", what.c_str(), item.c_str(), text.c_str());
    for (int c = lo; c <= hi; ++c) out.insert(c);
  }
  return {out.begin(), out.end()};
}

std::string topo_format_cpulist(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? std::to_string(cpus[i]) : strfmt("%d-%d", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

HostTopo topo_discover_sysfs(const std::string& root, const std::string& host) {
  HostTopo topo;
  topo.host = host;
  topo.source = "sysfs " + root;
  fs::path pci_dir = fs::path(root) / "bus/pci/devices";
  std::error_code ec;
  DF_CHECK(fs::is_directory(pci_dir, ec),
           "%s is not a directory: --sysfs-root must name a sysfs tree (e.g. /sys)", pci_dir.c_str());
  std::vector<std::string> bdfs;
  for (const auto& e : fs::directory_iterator(pci_dir)) {
    const std::string vendor = read_trimmed(e.path() / "vendor"),
                      pci_class = read_trimmed(e.path() / "class");
    if (is_nvidia_gpu(vendor, pci_class)) bdfs.push_back(e.path().filename().string());
    if (is_nvswitch(vendor, pci_class)) topo.nvlink = NvlinkSeen::present;
  }
  std::sort(bdfs.begin(), bdfs.end());
  for (const std::string& bdf : bdfs) {
    GpuInfo g;
    g.index = static_cast<int>(topo.gpus.size());
    g.bus_id = bdf;
    std::transform(g.bus_id.begin(), g.bus_id.end(), g.bus_id.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    g.pci_class = read_trimmed(pci_dir / bdf / "class");
    read_gpu_locality(pci_dir / bdf, g);
    topo.gpus.push_back(std::move(g));
  }
  read_cpu_topology(root, topo);
  if (topo.gpus.empty())
    topo.warnings.push_back(strfmt("host %s: no NVIDIA GPU under %s", host.c_str(), pci_dir.c_str()));
  warn_unknown_numa(topo);
  return topo;
}

HostTopo topo_discover_local(const std::string& host) {
  std::vector<GpuInfo> gpus;
  std::string why_not;
  if (!nvml_list_gpus(gpus, why_not)) return topo_discover_sysfs("/sys", host);
  HostTopo topo;
  topo.host = host;
  topo.source = "nvml";
  for (GpuInfo& g : gpus) read_gpu_locality(fs::path("/sys/bus/pci/devices") / g.bus_id, g);
  topo.gpus = std::move(gpus);
  const bool known =
      std::all_of(topo.gpus.begin(), topo.gpus.end(), [](const GpuInfo& g) { return g.nvlinks >= 0; });
  const bool any =
      std::any_of(topo.gpus.begin(), topo.gpus.end(), [](const GpuInfo& g) { return g.nvlinks > 0; });
  topo.nvlink = any                           ? NvlinkSeen::present
                : known && !topo.gpus.empty() ? NvlinkSeen::none
                                              : NvlinkSeen::unknown;
  read_cpu_topology("/sys", topo);
  warn_unknown_numa(topo);
  return topo;
}

std::string topo_local_hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  std::string h = buf;
  return h.substr(0, h.find('.'));
}

void topo_apply_numa_map(HostTopo& topo, const std::string& map_text) {
  std::vector<int> numa_of(topo.gpus.size(), -2);
  std::stringstream ss(map_text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t colon = item.find(':');
    DF_CHECK(colon != std::string::npos, "--numa '%s': item '%s' is not GPUS:NUMA (e.g. 0-3:1)",
             map_text.c_str(), item.c_str());
    int numa = parse_int(item.substr(colon + 1), "--numa '" + map_text + "' NUMA id");
    DF_CHECK(numa >= 0, "--numa '%s': NUMA id must be >= 0", map_text.c_str());
    std::string gpus_text = item.substr(0, colon);
    for (int g : topo_parse_cpulist(gpus_text, "--numa '" + map_text + "' GPU range")) {
      DF_CHECK(g < static_cast<int>(topo.gpus.size()),
               "--numa '%s': GPU %d does not exist on host %s (%zu GPUs)", map_text.c_str(), g,
               topo.host.c_str(), topo.gpus.size());
      DF_CHECK(numa_of[g] == -2, "--numa '%s': GPU %d is mapped twice", map_text.c_str(), g);
      numa_of[g] = numa;
    }
  }
  for (size_t g = 0; g < topo.gpus.size(); ++g) {
    DF_CHECK(numa_of[g] != -2, "--numa '%s' leaves GPU %zu of host %s unmapped: cover every GPU 0-%zu",
             map_text.c_str(), g, topo.host.c_str(), topo.gpus.size() - 1);
    topo.gpus[g].numa = numa_of[g];
  }
  std::erase_if(topo.warnings,
                [](const std::string& w) { return w.find("numa_node -1") != std::string::npos; });
}

GpuPath topo_gpu_path(const HostTopo& topo, int gpu_a, int gpu_b) {
  DF_CHECK(gpu_a >= 0 && gpu_b >= 0 && size_t(std::max(gpu_a, gpu_b)) < topo.gpus.size(),
           "host %s: GPU %d or %d does not exist (%zu GPUs)", topo.host.c_str(), gpu_a, gpu_b,
           topo.gpus.size());
  const GpuInfo &a = topo.gpus[size_t(gpu_a)], &b = topo.gpus[size_t(gpu_b)];
  // NVML's per-GPU count where it was read; else the host's NVSwitch, which connects every GPU.
  const bool per_gpu = a.nvlinks >= 0 && b.nvlinks >= 0;
  if (per_gpu ? a.nvlinks > 0 && b.nvlinks > 0 : topo.nvlink == NvlinkSeen::present) return GpuPath::nvlink;
  if (a.numa < 0 || b.numa < 0) return GpuPath::unknown;
  return a.numa == b.numa ? GpuPath::node : GpuPath::sys;
}

const char* nvlink_seen_name(NvlinkSeen n) {
  switch (n) {
    case NvlinkSeen::none:
      return "none";
    case NvlinkSeen::present:
      return "present";
    default:
      return "unknown (sysfs: no NVSwitch seen)";
  }
}

const char* gpu_path_name(GpuPath p) {
  switch (p) {
    case GpuPath::nvlink:
      return "NV";
    case GpuPath::node:
      return "NODE";
    case GpuPath::sys:
      return "SYS";
    default:
      return "unknown";
  }
}

double topo_pcie_bytes_per_s(const GpuInfo& g) {
  if (g.pcie_gts <= 0 || g.pcie_width <= 0) return 0;
  const double encoding = g.pcie_gts >= 8 ? 128.0 / 130.0 : 8.0 / 10.0;
  return g.pcie_gts * 1e9 * encoding * g.pcie_width / 8.0;
}

std::string topo_pcie_name(const GpuInfo& g) {
  if (g.pcie_gts <= 0 || g.pcie_width <= 0) return "PCIe link unknown";
  // The generation whose lane rate this is: 2.5, 5, 8, 16, 32, 64 GT/s are PCIe 1.0 to 6.0.
  const double rates[] = {2.5, 5, 8, 16, 32, 64};
  for (int i = 0; i < 6; ++i)
    if (std::fabs(g.pcie_gts - rates[i]) < 0.01) return strfmt("PCIe %d.0 x%d", i + 1, g.pcie_width);
  return strfmt("PCIe %.1f GT/s x%d", g.pcie_gts, g.pcie_width);
}

const NumaNode* topo_find_numa(const HostTopo& topo, int id) {
  for (const NumaNode& n : topo.numa_nodes)
    if (n.id == id) return &n;
  return nullptr;
}

}  // namespace df
