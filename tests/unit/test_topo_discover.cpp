// Discovery on the sysfs fixtures (bare metal, VM without NUMA, SMT host, the seed's PCIe-only box), the
// paths and PCIe links between GPUs, the --numa override, cpu list and SLURM host list parsing.
#include <cstdlib>

#include "topo/hostlist.h"
#include "topo/topo.h"
#include "topo_test_util.h"

namespace df {
namespace {

const std::vector<std::string> kBus8 = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                                        "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"};

std::vector<int> range(int lo, int hi) {
  std::vector<int> v;
  for (int i = lo; i <= hi; ++i) v.push_back(i);
  return v;
}

TEST(TopoCpulist, ParseAndFormatRoundTrip) {
  EXPECT_EQ(topo_parse_cpulist("0-3,8,10-11", "t"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(topo_parse_cpulist("7", "t"), std::vector<int>{7});
  EXPECT_TRUE(topo_parse_cpulist("", "t").empty());
  EXPECT_EQ(topo_format_cpulist({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(topo_format_cpulist({19}), "19");
  EXPECT_EQ(topo_format_cpulist(topo_parse_cpulist("64-95,0-31", "t")), "0-31,64-95");
  expect_error_with([] { topo_parse_cpulist("3-1", "myfile"); }, "myfile");
  expect_error_with([] { topo_parse_cpulist("0-x", "myfile"); }, "expected an integer");
}

TEST(TopoDiscover, BareMetalFourPlusFour) {
  HostTopo t = topo_discover_sysfs(topo_fixture("bare_4x4"), "node01");
  EXPECT_EQ(t.host, "node01");
  ASSERT_EQ(t.gpus.size(), 8u) << "the NVSwitch, the BMC VGA and the NIC must not count as GPUs";
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(t.gpus[i].index, i);
    EXPECT_EQ(t.gpus[i].bus_id, kBus8[i]);
    EXPECT_EQ(t.gpus[i].pci_class, "0x030200");
    EXPECT_EQ(t.gpus[i].numa, i < 4 ? 0 : 1);
    EXPECT_EQ(t.gpus[i].local_cpus, i < 4 ? range(0, 31) : range(32, 63));
  }
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  EXPECT_EQ(t.numa_nodes[0].cpus, range(0, 31));
  EXPECT_EQ(t.numa_nodes[1].cpus, range(32, 63));
  EXPECT_EQ(t.all_cpus, range(0, 63));
  EXPECT_EQ(t.core_of_cpu.at(45), 45) << "no thread_siblings_list: every cpu is its own core";
  EXPECT_TRUE(t.warnings.empty());
}

TEST(TopoDiscover, VmHidesNumaAndWarns) {
  HostTopo t = topo_discover_sysfs(topo_fixture("vm_8"), "vm1");
  ASSERT_EQ(t.gpus.size(), 8u);
  for (const GpuInfo& g : t.gpus) EXPECT_EQ(g.numa, -1);
  ASSERT_EQ(t.numa_nodes.size(), 1u);
  EXPECT_EQ(t.numa_nodes[0].cpus, range(0, 63));
  ASSERT_EQ(t.warnings.size(), 1u);
  EXPECT_NE(t.warnings[0].find("GPUs 0,1,2,3,4,5,6,7 report numa_node -1"), std::string::npos)
      << t.warnings[0];
}

TEST(TopoDiscover, SmtSiblingsMapToFirstThread) {
  HostTopo t = topo_discover_sysfs(topo_fixture("two_hosts/nodeB"), "nodeB");
  ASSERT_EQ(t.gpus.size(), 4u);
  EXPECT_EQ(t.core_of_cpu.at(17), 1);
  EXPECT_EQ(t.core_of_cpu.at(1), 1);
  EXPECT_EQ(t.core_of_cpu.at(31), 15);
  EXPECT_EQ(t.numa_nodes[1].cpus, topo_parse_cpulist("8-15,24-31", "t"));
}

TEST(TopoDiscover, PcieOnlyTwoSocketBoxHasNodeAndSysPathsAndGen5Links) {
  HostTopo t = topo_discover_sysfs(topo_fixture("pcie_8x_2numa"), "seed");
  ASSERT_EQ(t.gpus.size(), 8u) << "the BMC VGA and the NIC must not count as GPUs";
  EXPECT_EQ(t.nvlink, NvlinkSeen::unknown) << "no NVSwitch on the bus; sysfs cannot see bridges";
  for (const GpuInfo& g : t.gpus) {
    EXPECT_EQ(g.numa, g.index < 4 ? 0 : 1);
    EXPECT_EQ(g.pcie_gts, 32.0);
    EXPECT_EQ(g.pcie_width, 16);
    EXPECT_EQ(g.nvlinks, -1);
    // 32 GT/s x 16 lanes x 128/130 / 8 bits.
    EXPECT_NEAR(topo_pcie_bytes_per_s(g), 63.0154e9, 0.0001e9);
    EXPECT_EQ(topo_pcie_name(g), "PCIe 5.0 x16");
  }
  // What `nvidia-smi topo -m` showed on that machine: NODE within a socket, SYS across.
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b)
      if (a != b)
        EXPECT_EQ(topo_gpu_path(t, a, b), (a < 4) == (b < 4) ? GpuPath::node : GpuPath::sys) << a << b;
  EXPECT_TRUE(t.warnings.empty());
  expect_error_with([&] { topo_gpu_path(t, 0, 8); }, "GPU 0 or 8 does not exist");
}

TEST(TopoDiscover, NvswitchMeansNvlinkPathsAndLinksWithoutFilesAreUnknown) {
  HostTopo t = topo_discover_sysfs(topo_fixture("bare_4x4"), "hgx");
  EXPECT_EQ(t.nvlink, NvlinkSeen::present);
  EXPECT_EQ(topo_gpu_path(t, 0, 7), GpuPath::nvlink);
  EXPECT_EQ(topo_pcie_bytes_per_s(t.gpus[0]), 0.0);
  EXPECT_EQ(topo_pcie_name(t.gpus[0]), "PCIe link unknown");
  // A VM that hides NUMA nodes and shows no NVSwitch: the path is unknown.
  HostTopo vm = topo_discover_sysfs(topo_fixture("vm_8"), "vm");
  EXPECT_EQ(topo_gpu_path(vm, 0, 1), GpuPath::unknown);
  // NVML's per-GPU counts win over the host's NVSwitch flag: 0 NVLinks on one side is PCIe.
  t.gpus[0].nvlinks = 0;
  t.gpus[7].nvlinks = 18;
  EXPECT_EQ(topo_gpu_path(t, 0, 7), GpuPath::sys);
  GpuInfo gen3;
  gen3.pcie_gts = 8;
  gen3.pcie_width = 8;
  EXPECT_EQ(topo_pcie_name(gen3), "PCIe 3.0 x8");
  GpuInfo gen2;
  gen2.pcie_gts = 5;
  gen2.pcie_width = 16;
  EXPECT_DOUBLE_EQ(topo_pcie_bytes_per_s(gen2), 5e9 * 0.8 * 16 / 8) << "8b/10b below 8 GT/s";
}

TEST(TopoDiscover, MissingRootNamesThePath) {
  expect_error_with([] { topo_discover_sysfs("/nonexistent/sysroot", "h"); },
                    "/nonexistent/sysroot/bus/pci/devices");
}

TEST(TopoNumaMap, OverridesAndClearsWarning) {
  HostTopo t = topo_discover_sysfs(topo_fixture("vm_8"), "vm1");
  topo_apply_numa_map(t, "0-3:1,4-7:0");
  for (int i = 0; i < 8; ++i) EXPECT_EQ(t.gpus[i].numa, i < 4 ? 1 : 0);
  EXPECT_TRUE(t.warnings.empty());
}

TEST(TopoNumaMap, RejectsGapsOverlapsAndUnknownGpus) {
  HostTopo t = topo_discover_sysfs(topo_fixture("vm_8"), "vm1");
  expect_error_with([&] { topo_apply_numa_map(t, "0-3:1,4-6:0"); }, "leaves GPU 7 of host vm1 unmapped");
  expect_error_with([&] { topo_apply_numa_map(t, "0-4:1,4-7:0"); }, "GPU 4 is mapped twice");
  expect_error_with([&] { topo_apply_numa_map(t, "0-8:0"); }, "GPU 8 does not exist");
  expect_error_with([&] { topo_apply_numa_map(t, "0-7"); }, "is not GPUS:NUMA");
  expect_error_with([&] { topo_apply_numa_map(t, "0-7:-1"); }, "NUMA id must be >= 0");
}

TEST(TopoHostlist, ExpandsSlurmForms) {
  EXPECT_EQ(hostlist_expand("node[01-03,07]"),
            (std::vector<std::string>{"node01", "node02", "node03", "node07"}));
  EXPECT_EQ(hostlist_expand("a,b"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(hostlist_expand("n[8-11]"), (std::vector<std::string>{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(hostlist_expand("rack[1-2]-g[1,3],login"),
            (std::vector<std::string>{"rack1-g1", "rack1-g3", "rack2-g1", "rack2-g3", "login"}));
  expect_error_with([] { hostlist_expand("node[01-"); }, "unclosed");
  expect_error_with([] { hostlist_expand("node[3-1]"); }, "reversed");
  expect_error_with([] { hostlist_expand("node[a-b]"); }, "is not N or N-M");
  expect_error_with([] { hostlist_expand("a,,b"); }, "empty or malformed");
}

TEST(TopoHostlist, FromSlurmEnvironment) {
  const char* saved = std::getenv("SLURM_JOB_NODELIST");
  std::string keep = saved ? saved : "";
  unsetenv("SLURM_NODELIST");
  setenv("SLURM_JOB_NODELIST", "gpu[1-2]", 1);
  EXPECT_EQ(hostlist_from_slurm(), (std::vector<std::string>{"gpu1", "gpu2"}));
  unsetenv("SLURM_JOB_NODELIST");
  expect_error_with([] { hostlist_from_slurm(); }, "SLURM_JOB_NODELIST is not set");
  if (saved) setenv("SLURM_JOB_NODELIST", keep.c_str(), 1);
}

}  // namespace
}  // namespace df
