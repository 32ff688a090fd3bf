// Rankfile placement on the fixtures (exact text for 7-1 on 4+4 and for two hosts), the drafter rule on
// other splits and uneven NUMA nodes, impossible requests, the parser (round trip and each error), and
// the NCCL topology XML.
#include <cstdio>
#include <fstream>

#include "topo/nccl_xml.h"
#include "topo/rankfile.h"
#include "topo_test_util.h"

namespace df {
namespace {

std::vector<RankfileEntry> place(const std::vector<HostTopo>& hosts, int t, int d) {
  std::vector<std::string> warnings;
  return rankfile_place(hosts, t, d, warnings);
}

std::vector<int> drafter_gpus(const std::vector<RankfileEntry>& es) {
  std::vector<int> out;
  for (const RankfileEntry& e : es)
    if (e.role == RankRole::drafter) out.push_back(e.gpu);
  return out;
}

TEST(TopoRankfile, SevenOneOnFourPlusFourExactText) {
  HostTopo h = topo_discover_sysfs(topo_fixture("bare_4x4"), "node01");
  const std::string expected =
      "# Open MPI rankfile from `dflash_mpi topo rankfile`: targets=7 drafters=1 hosts=1\n"
      "# slot = cores of the node, each GPU bound to an equal share of its NUMA node's cores.\n"
      "# index = target / drafter index: batch b goes to target b % T, then to drafter b % D.\n"
      "rank 0=node01 slot=0-7  # role=target gpu=0 numa=0 index=0\n"
      "rank 1=node01 slot=8-15  # role=target gpu=1 numa=0 index=1\n"
      "rank 2=node01 slot=16-23  # role=target gpu=2 numa=0 index=2\n"
      "rank 3=node01 slot=24-31  # role=target gpu=3 numa=0 index=3\n"
      "rank 4=node01 slot=32-39  # role=target gpu=4 numa=1 index=4\n"
      "rank 5=node01 slot=40-47  # role=target gpu=5 numa=1 index=5\n"
      "rank 6=node01 slot=48-55  # role=target gpu=6 numa=1 index=6\n"
      "rank 7=node01 slot=56-63  # role=drafter gpu=7 numa=1 index=0\n";
  EXPECT_EQ(rankfile_format(place({h}, 7, 1)), expected);
}

TEST(TopoRankfile, DraftersPackOntoTheLastNumaNode) {
  HostTopo h = topo_discover_sysfs(topo_fixture("bare_4x4"), "n");
  EXPECT_EQ(drafter_gpus(place({h}, 6, 2)), (std::vector<int>{6, 7}));
  EXPECT_EQ(drafter_gpus(place({h}, 5, 3)), (std::vector<int>{5, 6, 7}));
  EXPECT_EQ(drafter_gpus(place({h}, 4, 4)), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(drafter_gpus(place({h}, 3, 5)), (std::vector<int>{3, 4, 5, 6, 7}));
  EXPECT_EQ(drafter_gpus(place({h}, 1, 7)), (std::vector<int>{1, 2, 3, 4, 5, 6, 7}));
}

TEST(TopoRankfile, PartialHostKeepsTargetsOffTheDrafterNode) {
  HostTopo h = topo_discover_sysfs(topo_fixture("bare_4x4"), "n");
  std::vector<RankfileEntry> es = place({h}, 2, 1);
  ASSERT_EQ(es.size(), 3u);
  EXPECT_EQ(es[0].gpu, 0);
  EXPECT_EQ(es[1].gpu, 1);
  EXPECT_EQ(es[2].gpu, 7);
  EXPECT_EQ(es[2].role, RankRole::drafter);
  EXPECT_EQ(es[2].rank, 2);
}

TEST(TopoRankfile, UnevenNodesPreferTheNodeThatFitsExactly) {
  // NUMA 0 holds 2 GPUs, NUMA 1 holds 6 (a GPU per core pair): 2 drafters fill NUMA 0 with no target beside
  // them.
  HostTopo h;
  h.host = "odd";
  for (int i = 0; i < 8; ++i) {
    GpuInfo g;
    g.index = i;
    g.numa = i < 2 ? 0 : 1;
    h.gpus.push_back(g);
  }
  h.numa_nodes = {{0, {0, 1, 2, 3}}, {1, {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}};
  std::vector<RankfileEntry> es = place({h}, 6, 2);
  EXPECT_EQ(drafter_gpus(es), (std::vector<int>{0, 1}));
  EXPECT_EQ(es[0].slot, "0-1");
  EXPECT_EQ(es[2].slot, "4-5");
  EXPECT_EQ(es[7].slot, "14-15");
}

TEST(TopoRankfile, VmTreatsUnknownNumaAsOneGroup) {
  HostTopo h = topo_discover_sysfs(topo_fixture("vm_8"), "vm1");
  std::vector<RankfileEntry> es = place({h}, 7, 1);
  EXPECT_EQ(drafter_gpus(es), std::vector<int>{7});
  EXPECT_EQ(es[7].numa, -1);
  EXPECT_EQ(es[0].slot, "0-7");
  EXPECT_EQ(es[7].slot, "56-63");
}

TEST(TopoRankfile, TwoHostsExactText) {
  std::vector<HostTopo> hosts = {topo_discover_sysfs(topo_fixture("two_hosts/nodeA"), "nodeA"),
                                 topo_discover_sysfs(topo_fixture("two_hosts/nodeB"), "nodeB")};
  // nodeB has SMT (cpu c and c+16 are one core): its 8 cores per node split 4 per GPU. Batch b goes to
  // target b % 6 and drafter b % 2, so even targets feed drafter 0 and odd ones drafter 1: each host holds
  // one such group whole.
  const std::string expected =
      "# Open MPI rankfile from `dflash_mpi topo rankfile`: targets=6 drafters=2 hosts=2\n"
      "# slot = cores of the node, each GPU bound to an equal share of its NUMA node's cores.\n"
      "# index = target / drafter index: batch b goes to target b % T, then to drafter b % D.\n"
      "rank 0=nodeA slot=0-7  # role=target gpu=0 numa=0 index=0\n"
      "rank 1=nodeA slot=8-15  # role=target gpu=1 numa=0 index=2\n"
      "rank 2=nodeA slot=16-23  # role=target gpu=2 numa=1 index=4\n"
      "rank 3=nodeA slot=24-31  # role=drafter gpu=3 numa=1 index=0\n"
      "rank 4=nodeB slot=0-3  # role=target gpu=0 numa=0 index=1\n"
      "rank 5=nodeB slot=4-7  # role=target gpu=1 numa=0 index=3\n"
      "rank 6=nodeB slot=8-11  # role=target gpu=2 numa=1 index=5\n"
      "rank 7=nodeB slot=12-15  # role=drafter gpu=3 numa=1 index=1\n";
  EXPECT_EQ(rankfile_format(place(hosts, 6, 2)), expected);
}

TEST(TopoRankfile, DrafterSharesFollowRanksPerHost) {
  std::vector<HostTopo> hosts = {topo_discover_sysfs(topo_fixture("two_hosts/nodeA"), "nodeA"),
                                 topo_discover_sysfs(topo_fixture("two_hosts/nodeB"), "nodeB")};
  // 6 ranks: 4 on nodeA, 2 on nodeB; one drafter goes to the host with the larger share.
  std::vector<RankfileEntry> es = place(hosts, 5, 1);
  ASSERT_EQ(es.size(), 6u);
  EXPECT_EQ(es[3].role, RankRole::drafter);
  EXPECT_EQ(es[3].host, "nodeA");
  EXPECT_EQ(es[4].host, "nodeB");
  EXPECT_EQ(es[5].gpu, 1);
  HostTopo big = topo_discover_sysfs(topo_fixture("bare_4x4"), "x");
  HostTopo big2 = big;
  big2.host = "y";
  std::vector<RankfileEntry> sixteen = place({big, big2}, 14, 2);
  EXPECT_EQ(sixteen[7].role, RankRole::drafter);
  EXPECT_EQ(sixteen[15].role, RankRole::drafter);
  EXPECT_EQ(sixteen[15].host, "y");
  EXPECT_EQ(drafter_gpus(sixteen), (std::vector<int>{7, 7}));
}

TEST(TopoRankfile, EightFourOnTwoEightGpuHostsKeepsFeaturesOnTheirHost) {
  HostTopo x = topo_discover_sysfs(topo_fixture("bare_4x4"), "x"), y = x;
  y.host = "y";
  std::vector<std::string> warnings;
  std::vector<RankfileEntry> es = rankfile_place({x, y}, 8, 4, warnings);
  // Filling x first (5 T + 3 D, then 3 T + 1 D on y) sent 3 of 8 targets' batches across hosts; with
  // b -> target b % 8 -> drafter b % 4, target t feeds drafter t % 4 only, so 4 T + 2 D per host keeps all.
  ASSERT_EQ(es.size(), 12u);
  FeatureTraffic f = rankfile_feature_traffic(es);
  EXPECT_EQ(f.pairs, 8);
  EXPECT_EQ(f.cross_pairs, 0);
  EXPECT_EQ(f.cross_share, 0.0);
  for (const std::string& w : warnings) EXPECT_EQ(w.find("crosses hosts"), std::string::npos) << w;
  std::vector<int> ts = rankfile_role_ranks(es, RankRole::target),
                   ds = rankfile_role_ranks(es, RankRole::drafter);
  for (int t = 0; t < 8; ++t) EXPECT_EQ(es[ts[t]].host, es[ds[t % 4]].host) << "target " << t;
  for (const char* host : {"x", "y"}) {
    int t = 0, d = 0;
    for (const RankfileEntry& e : es) {
      if (e.host != host) continue;
      (e.role == RankRole::target ? t : d)++;
      // Drafters on NUMA 1, which holds no target; targets on NUMA 0.
      EXPECT_EQ(e.numa, e.role == RankRole::drafter ? 1 : 0) << host << " rank " << e.rank;
    }
    EXPECT_EQ(t, 4) << host;
    EXPECT_EQ(d, 2) << host;
  }
  EXPECT_EQ(drafter_gpus(es), (std::vector<int>{6, 7, 6, 7}));
}

TEST(TopoRankfile, CountsThatCannotStayLocalSaySoAndHowMuchCrosses) {
  HostTopo x = topo_discover_sysfs(topo_fixture("bare_4x4"), "x"), y = x;
  y.host = "y";
  // 12 T + 3 D: three groups of 4 T + 1 D (5 GPUs); one fits each 8-GPU host, the third is cut in two. The
  // best cut keeps its drafter with 2 of its targets: 2 of the 12 carrying pairs cross.
  std::vector<std::string> warnings;
  FeatureTraffic f = rankfile_feature_traffic(rankfile_place({x, y}, 12, 3, warnings));
  EXPECT_EQ(f.pairs, 12);
  EXPECT_EQ(f.cross_pairs, 2);
  bool said = false;
  for (const std::string& w : warnings)
    said |= w.find("16.7% of the feature traffic crosses hosts") != std::string::npos &&
            w.find("HINT: --targets 12 --drafters 2 keeps every batch on its host") != std::string::npos;
  EXPECT_TRUE(said) << "no warning with the share and a local alternative";
  // 7 T + 1 D on two 4-GPU hosts: the single drafter sits with 3 targets, the other 4 send across.
  std::vector<HostTopo> small = {topo_discover_sysfs(topo_fixture("two_hosts/nodeA"), "nodeA"),
                                 topo_discover_sysfs(topo_fixture("two_hosts/nodeB"), "nodeB")};
  warnings.clear();
  f = rankfile_feature_traffic(rankfile_place(small, 7, 1, warnings));
  EXPECT_EQ(f.cross_pairs, 4);
  EXPECT_NEAR(f.cross_share, 4.0 / 7.0, 1e-12);  // a ratio of small integers: exact up to double rounding
  EXPECT_NE(
      feature_traffic_format(f, 2.0, 1e9).find("at 2 batches/s x 1e+09 B per batch: 1.143 GB/s across hosts"),
      std::string::npos)
      << feature_traffic_format(f, 2.0, 1e9);
}

TEST(TopoRankfile, SevenOneOnThePcieOnlyBoxCountsSysPairsAndTheDrafterLink) {
  HostTopo h = topo_discover_sysfs(topo_fixture("pcie_8x_2numa"), "seed");
  std::vector<RankfileEntry> es = place({h}, 7, 1);
  // The drafter keeps the last GPU of NUMA 1; each rank binds to 8 of its socket's 32 cores.
  EXPECT_EQ(drafter_gpus(es), std::vector<int>{7});
  EXPECT_EQ(es[7].slot, "56-63");
  EXPECT_EQ(es[0].slot, "0-7");
  FeatureTraffic f = rankfile_feature_traffic(es, {h});
  EXPECT_EQ(f.pairs, 7);
  EXPECT_EQ(f.cross_pairs, 0);
  EXPECT_EQ(f.node_pairs, 3) << "targets on GPUs 4-6 share the drafter's socket";
  EXPECT_EQ(f.sys_pairs, 4) << "targets on GPUs 0-3 send across the sockets";
  EXPECT_EQ(f.nvlink_pairs, 0);
  EXPECT_EQ(f.unknown_pairs, 0);
  EXPECT_EQ(f.drafter_link, "PCIe 5.0 x16");
  EXPECT_NEAR(f.drafter_link_bytes_per_s, 63.0154e9, 0.0001e9);
  // 0.5 batches/s of 1.68 GB: 0.84 GB/s into the one drafter, 1.33 % of 63.0154 GB/s.
  const std::string text = feature_traffic_format(f, 0.5, 1.68e9);
  EXPECT_NE(text.find("paths on a host: 0 NVLink, 3 NODE (PCIe within a NUMA node), 4 SYS"),
            std::string::npos)
      << text;
  EXPECT_NE(
      text.find("each drafter receives 0.84 GB/s of features: 1.3% of its PCIe 5.0 x16 link (63.0 GB/s"),
      std::string::npos)
      << text;
  // Without the hosts nothing is said about paths or links; on an NVSwitch box no PCIe line either.
  EXPECT_EQ(feature_traffic_format(rankfile_feature_traffic(es), 0.5, 1.68e9).find("paths on a host"),
            std::string::npos);
  HostTopo hgx = topo_discover_sysfs(topo_fixture("bare_4x4"), "hgx");
  FeatureTraffic nv = rankfile_feature_traffic(place({hgx}, 7, 1), {hgx});
  EXPECT_EQ(nv.nvlink_pairs, 7);
  EXPECT_EQ(feature_traffic_format(nv, 0.5, 1.68e9).find("each drafter receives"), std::string::npos);
}

TEST(TopoRankfile, ImpossibleRequestsSayWhy) {
  HostTopo h = topo_discover_sysfs(topo_fixture("bare_4x4"), "node01");
  expect_error_with([&] { place({h}, 8, 1); }, "9 ranks but only 8 GPUs (node01=8)");
  expect_error_with([&] { place({h}, 7, 0); }, "at least one drafter");
  expect_error_with([&] { place({h}, 0, 1); }, "at least one target");
  expect_error_with([&] { place({}, 1, 1); }, "no hosts");
}

TEST(TopoRankfileParse, RoundTrip) {
  std::vector<HostTopo> hosts = {topo_discover_sysfs(topo_fixture("two_hosts/nodeA"), "nodeA"),
                                 topo_discover_sysfs(topo_fixture("two_hosts/nodeB"), "nodeB")};
  std::vector<RankfileEntry> es = place(hosts, 5, 3);
  std::string path = std::string(DF_BINARY_DIR) + "/topo_roundtrip.rf";
  std::ofstream(path) << rankfile_format(es);
  std::vector<RankfileEntry> back = rankfile_parse(path);
  std::remove(path.c_str());
  ASSERT_EQ(back.size(), es.size());
  for (size_t i = 0; i < es.size(); ++i) {
    EXPECT_EQ(back[i].rank, es[i].rank);
    EXPECT_EQ(back[i].host, es[i].host);
    EXPECT_EQ(back[i].slot, es[i].slot);
    EXPECT_EQ(back[i].role, es[i].role);
    EXPECT_EQ(back[i].gpu, es[i].gpu);
    EXPECT_EQ(back[i].numa, es[i].numa);
    EXPECT_EQ(back[i].index, es[i].index);
  }
  EXPECT_EQ(rankfile_role_ranks(back, RankRole::target), rankfile_role_ranks(es, RankRole::target));
}

TEST(TopoRankfileParse, HandWrittenFileWithCommentsAndOrder) {
  const std::string text =
      "# hand-written\n"
      "\n"
      "rank 1=node01 slot=1:24-31  # role=drafter gpu=7 numa=1 note=spare\n"
      "   # indented comment\n"
      "rank 0=node01 slot=0-7 #role=target\n";
  std::vector<RankfileEntry> es = rankfile_parse_text(text, "hand.rf");
  ASSERT_EQ(es.size(), 2u);
  EXPECT_EQ(es[0].rank, 0);
  EXPECT_EQ(es[0].role, RankRole::target);
  EXPECT_EQ(es[0].gpu, -1);
  EXPECT_EQ(es[0].numa, -1);
  EXPECT_EQ(es[1].slot, "1:24-31");
  EXPECT_EQ(es[1].role, RankRole::drafter);
  EXPECT_EQ(es[1].gpu, 7);
  EXPECT_EQ(es[1].numa, 1);
}

TEST(TopoRankfileParse, ErrorsNameTheLine) {
  const std::string ok = "rank 0=h slot=0-7  # role=target\n";
  expect_error_with([&] { rankfile_parse_text(ok + "rank 1=h slot=8-15\n", "f.rf"); },
                    "f.rf:2: rank 1 has no");
  expect_error_with([&] { rankfile_parse_text(ok + "rank 1=h slot=8  # role=boss\n", "f.rf"); },
                    "f.rf:2: role 'boss'");
  expect_error_with([&] { rankfile_parse_text(ok + "\nrank 0=h slot=8  # role=target\n", "f.rf"); },
                    "f.rf:3: rank 0 already given on line 1");
  expect_error_with([&] { rankfile_parse_text(ok + "rank 2=h slot=8  # role=target\n", "f.rf"); },
                    "rank 1 is missing");
  expect_error_with([&] { rankfile_parse_text(ok + "rank 1=h slot=a-b  # role=target\n", "f.rf"); },
                    "f.rf:2: 'slot=a-b'");
  expect_error_with([&] { rankfile_parse_text("rank x=h slot=0  # role=target\n", "f.rf"); },
                    "f.rf:1: 'x=h'");
  expect_error_with([&] { rankfile_parse_text("rank 0= slot=0  # role=target\n", "f.rf"); },
                    "f.rf:1: rank 0 has no host");
  expect_error_with([&] { rankfile_parse_text("rank 0=h slot=0 extra  # role=target\n", "f.rf"); },
                    "f.rf:1: expected");
  expect_error_with([&] { rankfile_parse_text("rank 0=h slot=0  # role\n", "f.rf"); },
                    "f.rf:1: annotation 'role'");
  expect_error_with([&] { rankfile_parse_text("rank 0=h slot=0  # role=target gpu=-2\n", "f.rf"); },
                    "f.rf:1: gpu '-2'");
  expect_error_with([&] { rankfile_parse_text("rank 0=h slot=0  # role=target numa=x\n", "f.rf"); },
                    "f.rf:1: numa 'x'");
  expect_error_with([&] { rankfile_parse_text("# only comments\n", "f.rf"); }, "f.rf: no `rank");
  expect_error_with(
      [] {
        rankfile_parse_text(
            "rank 0=h slot=0  # role=target index=0\n"
            "rank 1=h slot=1  # role=drafter\n",
            "f.rf");
      },
      "f.rf: 1 of 2 ranks carry `index=`");
  expect_error_with(
      [] {
        rankfile_parse_text(
            "rank 0=h slot=0  # role=target index=1\n"
            "rank 1=h slot=1  # role=target index=1\n"
            "rank 2=h slot=1  # role=drafter index=0\n",
            "f.rf");
      },
      "f.rf: target indices must run 0..1 once each, but rank 0 has index=1");
  expect_error_with([] { rankfile_parse_text("rank 0=h slot=0  # role=target index=x\n", "f.rf"); },
                    "f.rf:1: index 'x'");
  expect_error_with([] { rankfile_parse("/nonexistent/x.rf"); }, "cannot open rankfile '/nonexistent/x.rf'");
}

TEST(TopoNcclXml, CpumaskMatchesLinuxCpumap) {
  std::vector<int> low, high;
  for (int c = 0; c < 32; ++c) low.push_back(c);
  for (int c = 32; c < 64; ++c) high.push_back(c);
  EXPECT_EQ(nccl_xml_cpumask(low), "ffffffff");
  EXPECT_EQ(nccl_xml_cpumask(high), "ffffffff,00000000");
  EXPECT_EQ(nccl_xml_cpumask({0, 33}), "00000002,00000001");
  EXPECT_EQ(nccl_xml_cpumask({65}), "00000002,00000000,00000000");
}

TEST(TopoNcclXml, VmWithNumaMapGroupsGpusUnderTheirNode) {
  HostTopo h = topo_discover_sysfs(topo_fixture("vm_8"), "vm1");
  topo_apply_numa_map(h, "0-3:1,4-7:0");
  std::vector<std::string> warnings;
  std::string xml = nccl_xml_format(h, warnings);
#if defined(__aarch64__)
  const std::string arch = "arm64";
#else
  const std::string arch = "x86_64";
#endif
  const std::string expected =
      "<system version=\"1\" name=\"dflash_mpi vm1\">\n"
      "  <cpu numaid=\"0\" affinity=\"ffffffff,ffffffff\" arch=\"" +
      arch +
      "\">\n"
      "    <pci busid=\"0000:9a:00.0\" class=\"0x030200\" vendor=\"0x10de\"/>\n"
      "    <pci busid=\"0000:ab:00.0\" class=\"0x030200\" vendor=\"0x10de\"/>\n"
      "    <pci busid=\"0000:ba:00.0\" class=\"0x030200\" vendor=\"0x10de\"/>\n"
      "    <pci busid=\"0000:db:00.0\" class=\"0x030200\" vendor=\"0x10de\"/>\n"
      "  </cpu>\n"
      "  <cpu numaid=\"1\" affinity=\"ffffffff,ffffffff\" arch=\"" +
      arch +
      "\">\n"
      "    <pci busid=\"0000:18:00.0\" class=\"0x030200\" vendor=\"0x10de\"/>\n"
      "    <pci busid=\"0000:2a:00.0\" class=\"0x030200\" vendor=\"0x10de\"/>\n"
      "    <pci busid=\"0000:3a:00.0\" class=\"0x030200\" vendor=\"0x10de\"/>\n"
      "    <pci busid=\"0000:5d:00.0\" class=\"0x030200\" vendor=\"0x10de\"/>\n"
      "  </cpu>\n"
      "</system>\n";
  EXPECT_EQ(xml, expected);
  ASSERT_EQ(warnings.size(), 1u) << "the VM lists no node1: its affinity falls back to every cpu";
  EXPECT_NE(warnings[0].find("no NUMA node 1"), std::string::npos) << warnings[0];
}

TEST(TopoNcclXml, BareMetalUsesEachNodesCpus) {
  HostTopo h = topo_discover_sysfs(topo_fixture("bare_4x4"), "n");
  std::vector<std::string> warnings;
  std::string xml = nccl_xml_format(h, warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_NE(xml.find("<cpu numaid=\"0\" affinity=\"ffffffff\""), std::string::npos) << xml;
  EXPECT_NE(xml.find("<cpu numaid=\"1\" affinity=\"ffffffff,00000000\""), std::string::npos) << xml;
}

}  // namespace
}  // namespace df
