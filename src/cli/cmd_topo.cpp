// `dflash_mpi topo discover|rankfile|nccl-xml`: turns the machines' GPU/NUMA layout into an Open MPI
// rankfile with roles and core bindings, and into an NCCL topology file for VMs that hide NUMA nodes.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/config.h"
#include "core/count_noun.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"
#include "model/qwen_config.h"
#include "topo/hostlist.h"
#include "topo/nccl_xml.h"
#include "topo/plan_flops.h"
#include "topo/plan_split.h"
#include "topo/rankfile.h"
#include "topo/topo.h"

namespace df {

namespace {

struct TopoOptions {
  std::string sysfs_root;              // empty: the live machine (NVML, then /sys)
  std::vector<std::string> host_dirs;  // NAME=DIR: one sysfs tree per host
  std::string hosts;                   // h1,h2 or node[01-02]: hosts assumed to look like this one
  bool slurm = false;
  std::string numa_map;
  int targets = 0, drafters = 0;
  std::string config;                        // for the bytes of one batch's features
  std::string target_config;                 // overrides the config's target architecture
  double target_rate = 0, drafter_rate = 0;  // batches/s per GPU, as `plan split` takes them
  std::string out;
  bool json = false;
  bool force = false;
};

void add_host_options(CLI::App* sub, TopoOptions& o, bool host_lists) {
  sub->add_option("--sysfs-root", o.sysfs_root,
                  "read this sysfs tree instead of the live machine (tests: fixtures)");
  sub->add_option("--host", o.host_dirs, "NAME=DIR: host NAME described by the sysfs tree DIR (repeatable)");
  if (!host_lists) return;
  sub->add_option("--hosts", o.hosts, "hosts h1,h2 or node[01-04], each assumed to look like this machine");
  sub->add_flag("--slurm", o.slurm, "hosts of the SLURM allocation (SLURM_JOB_NODELIST)");
}

// The hosts to place on, each with its topology. Warnings are printed once here.
std::vector<HostTopo> gather_hosts(const TopoOptions& o) {
  std::vector<HostTopo> out;
  if (!o.host_dirs.empty()) {
    DF_CHECK(o.sysfs_root.empty() && o.hosts.empty() && !o.slurm,
             "--host NAME=DIR names each host's topology itself: drop --sysfs-root/--hosts/--slurm");
    for (const std::string& hd : o.host_dirs) {
      size_t eq = hd.find('=');
      DF_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < hd.size(), "--host '%s' is not NAME=DIR",
               hd.c_str());
      out.push_back(topo_discover_sysfs(hd.substr(eq + 1), hd.substr(0, eq)));
    }
  } else {
    DF_CHECK(o.hosts.empty() || !o.slurm, "--hosts and --slurm both name the hosts: give one");
    std::vector<std::string> names = o.slurm           ? hostlist_from_slurm()
                                     : o.hosts.empty() ? std::vector<std::string>{topo_local_hostname()}
                                                       : hostlist_expand(o.hosts);
    HostTopo base =
        o.sysfs_root.empty() ? topo_discover_local(names[0]) : topo_discover_sysfs(o.sysfs_root, names[0]);
    for (size_t i = 0; i < names.size(); ++i) {
      out.push_back(base);
      out.back().host = names[i];
      if (i > 0) out.back().warnings.clear();
    }
    if (names.size() > 1)
      out.front().warnings.push_back(
          strfmt("assuming all %zu hosts have this machine's layout (%s); use --host "
                 "NAME=DIR per host when they differ",
                 names.size(), base.source.c_str()));
  }
  for (HostTopo& h : out) {
    if (!o.numa_map.empty()) topo_apply_numa_map(h, o.numa_map);
    for (const std::string& w : h.warnings) log_warn("%s", w.c_str());
  }
  return out;
}

// Before any discovery: an --out that is one of the sysfs trees read, or earlier output, is refused.
void check_out(const TopoOptions& o) {
  if (o.out.empty()) return;
  std::vector<std::string> inputs{o.sysfs_root};
  for (const std::string& hd : o.host_dirs) inputs.push_back(hd.substr(hd.find('=') + 1));
  file_check_output(o.out, inputs, o.force);
}

void write_or_print(const std::string& path, const std::string& text) {
  if (path.empty()) {
    std::fputs(text.c_str(), stdout);
    return;
  }
  file_write_text_atomic(path, text);
}

void run_discover(const TopoOptions& o) {
  std::vector<HostTopo> hosts = gather_hosts(o);
  if (o.json) {
    nlohmann::json j;
    j["hosts"] = nlohmann::json::array();
    for (const HostTopo& h : hosts) {
      nlohmann::json jh = {{"host", h.host}, {"source", h.source}, {"warnings", h.warnings}};
      jh["nvlink"] = nvlink_seen_name(h.nvlink);
      jh["numa_nodes"] = nlohmann::json::array();
      for (const NumaNode& n : h.numa_nodes)
        jh["numa_nodes"].push_back({{"id", n.id}, {"cpus", topo_format_cpulist(n.cpus)}});
      jh["gpus"] = nlohmann::json::array();
      for (const GpuInfo& g : h.gpus) {
        jh["gpus"].push_back({{"index", g.index},
                              {"bus_id", g.bus_id},
                              {"class", g.pci_class},
                              {"name", g.name},
                              {"numa", g.numa},
                              {"numa_known", g.numa >= 0},
                              {"local_cpus", topo_format_cpulist(g.local_cpus)},
                              {"pcie_gts", g.pcie_gts},
                              {"pcie_width", g.pcie_width},
                              {"pcie_bytes_per_s", topo_pcie_bytes_per_s(g)},
                              {"nvlinks", g.nvlinks}});
      }
      j["hosts"].push_back(jh);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  for (const HostTopo& h : hosts) {
    std::printf("host %s (%s): %zu GPUs, %zu NUMA nodes, NVLink %s\n", h.host.c_str(), h.source.c_str(),
                h.gpus.size(), h.numa_nodes.size(), nvlink_seen_name(h.nvlink));
    for (const NumaNode& n : h.numa_nodes)
      std::printf("  numa %d  cpus %s\n", n.id, topo_format_cpulist(n.cpus).c_str());
    for (const GpuInfo& g : h.gpus) {
      std::string numa = g.numa >= 0 ? std::to_string(g.numa) : "unknown";
      const double bw = topo_pcie_bytes_per_s(g);
      std::printf("  gpu %d  %s  numa %-7s  cpus %s  %s%s%s%s%s\n", g.index, g.bus_id.c_str(), numa.c_str(),
                  topo_format_cpulist(g.local_cpus).c_str(), topo_pcie_name(g).c_str(),
                  bw > 0 ? strfmt(" (%.1f GB/s a direction)", bw / 1e9).c_str() : "",
                  g.nvlinks >= 0 ? strfmt(", %d NVLinks", g.nvlinks).c_str() : "", g.name.empty() ? "" : "  ",
                  g.name.c_str());
    }
    // The matrix `nvidia-smi topo -m` prints, for the GPUs: how each pair's bytes travel.
    if (h.gpus.size() > 1) {
      std::printf("  paths:");
      for (const GpuInfo& g : h.gpus) std::printf(" %5s", strfmt("gpu%d", g.index).c_str());
      std::printf("\n");
      for (const GpuInfo& a : h.gpus) {
        std::printf("  %5s ", strfmt("gpu%d", a.index).c_str());
        for (const GpuInfo& b : h.gpus)
          std::printf(" %5s", a.index == b.index ? "X" : gpu_path_name(topo_gpu_path(h, a.index, b.index)));
        std::printf("\n");
      }
    }
  }
}

void run_rankfile(const TopoOptions& o) {
  check_out(o);
  std::vector<HostTopo> hosts = gather_hosts(o);
  std::vector<std::string> warnings;
  std::vector<RankfileEntry> entries = rankfile_place(hosts, o.targets, o.drafters, warnings);
  for (const std::string& w : warnings) log_warn("%s", w.c_str());
  write_or_print(o.out, rankfile_format(entries));
  const FeatureTraffic traffic = rankfile_feature_traffic(entries, hosts);
  // Batches/s of the pipeline (its slower side, as `plan split` computes it) times the bytes of one batch.
  // Where the feature paths are PCIe, the split pays the drafters' links for the feature stream and the
  // all-reduce.
  double rate = 0, bytes = 0;
  if (o.target_rate > 0 || o.drafter_rate > 0)
    DF_CHECK(o.target_rate > 0 && o.drafter_rate > 0 && !o.config.empty(),
             "--target-rate and --drafter-rate go together with --config (the bytes of one batch)");
  if (!o.config.empty()) {
    Config cfg = config_load(o.config);
    const std::string& arch = o.target_config.empty() ? cfg.target.architecture() : o.target_config;
    const FlopsPlan f = plan_flops_compute(cfg, qwen_config_load(arch), 0);
    bytes = f.payload_bytes;
    if (o.target_rate > 0) {
      SplitLinks links;
      const int local = traffic.nvlink_pairs + traffic.node_pairs + traffic.sys_pairs + traffic.unknown_pairs;
      if (traffic.nvlink_pairs < local && traffic.drafter_link_bytes_per_s > 0)
        links = {traffic.drafter_link_bytes_per_s, f.payload_bytes, f.grad_bytes, f.grad_accum,
                 traffic.drafter_link};
      const SplitPlan split =
          plan_split_compute(o.target_rate, o.drafter_rate, o.targets + o.drafters, {}, links);
      rate = split.rows[size_t(o.drafters - 1)].throughput;
      if (links.bytes_per_s > 0)
        std::fputs(strfmt("pipeline %.4g batches/s with the %s links' cost (plan split --link-gbps %.4g)\n",
                          rate, links.name.c_str(), links.bytes_per_s / 1e9)
                       .c_str(),
                   o.out.empty() ? stderr : stdout);
    }
  }
  std::fflush(stdout);
  std::fputs(feature_traffic_format(traffic, rate, bytes).c_str(), o.out.empty() ? stderr : stdout);
  if (!o.out.empty()) {
    std::printf("wrote %s: %s + %s = %zu ranks\n", o.out.c_str(), count_noun(o.targets, "target").c_str(),
                count_noun(o.drafters, "drafter").c_str(), entries.size());
    std::printf("launch: mpirun -np %zu --rankfile %s dflash_mpi ...\n", entries.size(), o.out.c_str());
  }
}

void run_nccl_xml(const TopoOptions& o) {
  check_out(o);
  std::vector<HostTopo> hosts = gather_hosts(o);
  DF_CHECK(hosts.size() == 1, "nccl-xml describes one host; run it once per host (got %zu)", hosts.size());
  DF_CHECK(!hosts[0].gpus.empty(), "host %s has no NVIDIA GPU: nothing to describe", hosts[0].host.c_str());
  std::vector<std::string> warnings;
  std::string xml = nccl_xml_format(hosts[0], warnings);
  for (const std::string& w : warnings) log_warn("%s", w.c_str());
  write_or_print(o.out, xml);
  std::printf("export NCCL_TOPO_FILE=%s\n", std::filesystem::absolute(o.out).c_str());
}

}  // namespace

void cmd_topo_register(CLI::App& app) {
  auto o = std::make_shared<TopoOptions>();
  CLI::App* topo = app.add_subcommand("topo", "GPU/NUMA discovery, rankfiles and NCCL topology files");
  topo->require_subcommand(1);

  CLI::App* disc =
      topo->add_subcommand("discover", "list hosts, GPUs (PCI bus id), NUMA nodes and local cpus");
  add_host_options(disc, *o, false);
  disc->add_flag("--json", o->json, "print JSON instead of a table");
  disc->callback([o] { run_discover(*o); });

  CLI::App* rf = topo->add_subcommand("rankfile", "write an Open MPI rankfile with target/drafter roles");
  rf->add_option("--targets", o->targets, "target ranks (one GPU each)")->required();
  rf->add_option("--drafters", o->drafters, "drafter ranks (one GPU each)")->required();
  add_host_options(rf, *o, true);
  rf->add_option("--numa", o->numa_map, "override GPU NUMA nodes, e.g. 0-3:1,4-7:0 (VMs)");
  rf->add_option("--out", o->out, "rankfile to write (default: stdout)");
  rf->add_flag("--force", o->force, "replace an existing non-empty output (never an input)");
  rf->add_option("--config", o->config,
                 "run config: the bytes of one batch's features, for the traffic line");
  rf->add_option("--target-config", o->target_config,
                 "config.json (or its directory) for the target architecture instead of the config's");
  rf->add_option("--target-rate", o->target_rate, "batches/s one target GPU produces (with --config)");
  rf->add_option("--drafter-rate", o->drafter_rate, "batches/s one drafter GPU consumes (with --config)");
  rf->callback([o] { run_rankfile(*o); });

  CLI::App* nx =
      topo->add_subcommand("nccl-xml", "write an NCCL_TOPO_FILE placing GPUs under their NUMA node");
  nx->add_option("--numa", o->numa_map, "GPU ranges to NUMA ids, e.g. 0-3:1,4-7:0 (default: as discovered)");
  add_host_options(nx, *o, false);
  nx->add_option("--out", o->out, "XML file to write")->required();
  nx->add_flag("--force", o->force, "replace an existing non-empty output (never an input)");
  nx->callback([o] { run_nccl_xml(*o); });
}

}  // namespace df
