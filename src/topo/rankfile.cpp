// Rank placement: which GPU of which host each target and drafter rank gets, and the cores it binds to.
// Features are the heavy traffic: each target's drafters sit on its own host where the counts allow, and
// on a host the drafters are packed onto as few NUMA nodes as possible, away from targets.
#include "topo/rankfile.h"

#include <algorithm>
#include <bit>
#include <map>
#include <numeric>
#include <set>

#include "core/count_noun.h"
#include "core/error.h"

namespace df {

namespace {

struct NumaGroup {
  int numa = -1;
  std::vector<int> gpus;  // ascending GPU index
};

std::vector<NumaGroup> group_by_numa(const HostTopo& h) {
  std::map<int, NumaGroup> m;
  for (const GpuInfo& g : h.gpus) {
    m[g.numa].numa = g.numa;
    m[g.numa].gpus.push_back(g.index);
  }
  std::vector<NumaGroup> out;
  for (auto& [id, grp] : m) out.push_back(std::move(grp));
  return out;
}

// The set of NUMA groups that holds `d` drafters with the fewest other GPUs beside them, then the fewest
// groups, then the last groups (bitmask compare: a higher bit is a later group).
unsigned choose_drafter_groups(const std::vector<NumaGroup>& groups, int d) {
  DF_CHECK(groups.size() <= 20, "%zu NUMA groups on one host: too many to place exhaustively", groups.size());
  unsigned best = 0;
  int best_waste = 0, best_count = 0;
  for (unsigned mask = 1; mask < (1u << groups.size()); ++mask) {
    int total = 0;
    for (size_t i = 0; i < groups.size(); ++i)
      if (mask & (1u << i)) total += static_cast<int>(groups[i].gpus.size());
    if (total < d) continue;
    int waste = total - d, count = std::popcount(mask);
    if (best == 0 || waste < best_waste || (waste == best_waste && count < best_count) ||
        (waste == best_waste && count == best_count && mask > best)) {
      best = mask;
      best_waste = waste;
      best_count = count;
    }
  }
  return best;
}

// Cores (first SMT thread of each) a group's GPUs share: its NUMA node's cpus when the host lists the
// node, else the GPUs' local cpus, else every cpu. Open MPI reads slot numbers as logical core indices;
// with Linux's usual numbering (every core's first thread before any second thread) a core's first cpu id
// is that index, so hyperthreads never appear in a slot list.
std::vector<int> group_cores(const HostTopo& h, const NumaGroup& grp) {
  std::set<int> cpus;
  if (const NumaNode* n = grp.numa >= 0 ? topo_find_numa(h, grp.numa) : nullptr)
    cpus.insert(n->cpus.begin(), n->cpus.end());
  if (cpus.empty())
    for (int g : grp.gpus) cpus.insert(h.gpus[g].local_cpus.begin(), h.gpus[g].local_cpus.end());
  if (cpus.empty()) cpus.insert(h.all_cpus.begin(), h.all_cpus.end());
  std::set<int> cores;
  for (int c : cpus) {
    auto it = h.core_of_cpu.find(c);
    cores.insert(it == h.core_of_cpu.end() ? c : it->second);
  }
  return {cores.begin(), cores.end()};
}

// Slot list per GPU index: the group's cores split into equal consecutive chunks in GPU order.
std::map<int, std::string> slots_by_gpu(const HostTopo& h, std::vector<std::string>& warnings) {
  std::map<int, std::string> out;
  for (const NumaGroup& grp : group_by_numa(h)) {
    std::vector<int> cores = group_cores(h, grp);
    DF_CHECK(!cores.empty(), "host %s: no cpus known for NUMA node %d (source %s): cannot bind its GPUs",
             h.host.c_str(), grp.numa, h.source.c_str());
    size_t m = grp.gpus.size(), c = cores.size();
    if (c < m)
      warnings.push_back(strfmt("host %s NUMA %d: %zu cores for %zu GPUs, ranks share cores", h.host.c_str(),
                                grp.numa, c, m));
    for (size_t k = 0; k < m; ++k) {
      size_t lo = k * c / m, hi = std::max((k + 1) * c / m, lo + 1);
      out[grp.gpus[k]] =
          topo_format_cpulist(std::vector<int>(cores.begin() + lo, cores.begin() + std::min(hi, c)));
    }
  }
  return out;
}

// Drafters per host in proportion to the host's ranks (largest remainder; ties to the earlier host).
std::vector<int> drafter_shares(const std::vector<int>& ranks_on, int drafters, int total) {
  std::vector<int> share(ranks_on.size());
  std::vector<std::pair<long, size_t>> rem;
  int given = 0;
  for (size_t h = 0; h < ranks_on.size(); ++h) {
    long num = static_cast<long>(drafters) * ranks_on[h];
    share[h] = static_cast<int>(num / total);
    given += share[h];
    rem.push_back({-(num % total), h});
  }
  std::sort(rem.begin(), rem.end());
  for (size_t i = 0; given < drafters; ++i, ++given) share[rem[i].second]++;
  return share;
}

// GPUs of one host for `t` targets and `d` drafters, as (gpu, role) in GPU order.
std::vector<std::pair<int, RankRole>> place_on_host(const HostTopo& h, int t, int d) {
  std::vector<NumaGroup> groups = group_by_numa(h);
  std::vector<bool> in_drafter_group(h.gpus.size(), false), is_drafter(h.gpus.size(), false);
  if (d > 0) {
    unsigned mask = choose_drafter_groups(groups, d);
    std::vector<int> pool;
    for (size_t i = 0; i < groups.size(); ++i)
      if (mask & (1u << i))
        for (int g : groups[i].gpus) {
          pool.push_back(g);
          in_drafter_group[g] = true;
        }
    std::sort(pool.rbegin(), pool.rend());
    for (int i = 0; i < d; ++i) is_drafter[pool[i]] = true;
  }
  std::vector<int> free_gpus;
  for (const GpuInfo& g : h.gpus)
    if (!is_drafter[g.index]) free_gpus.push_back(g.index);
  std::stable_sort(free_gpus.begin(), free_gpus.end(),
                   [&](int a, int b) { return !in_drafter_group[a] && in_drafter_group[b]; });
  std::vector<std::pair<int, RankRole>> out;
  for (int i = 0; i < t; ++i) out.push_back({free_gpus[i], RankRole::target});
  for (const GpuInfo& g : h.gpus)
    if (is_drafter[g.index]) out.push_back({g.index, RankRole::drafter});
  std::sort(out.begin(), out.end());
  return out;
}

// Whether every class of T/g targets + D/g drafters can sit whole on some host (see rankfile_place).
bool classes_fit(const std::vector<HostTopo>& hosts, int targets, int drafters) {
  const int g = std::gcd(targets, drafters), size = (targets + drafters) / g;
  int whole = 0;
  for (const HostTopo& h : hosts) whole += static_cast<int>(h.gpus.size()) / size;
  return whole >= g;
}

// The hint for counts that cannot stay local: the nearest drafter count that can, for the same targets.
std::string local_hint(const std::vector<HostTopo>& hosts, int targets, int drafters) {
  int gpus = 0;
  for (const HostTopo& h : hosts) gpus += static_cast<int>(h.gpus.size());
  for (int step = 1; step < gpus; ++step)
    for (int d : {drafters - step, drafters + step})
      if (d >= 1 && targets + d <= gpus && classes_fit(hosts, targets, d))
        return strfmt("--targets %d --drafters %d keeps every batch on its host", targets, d);
  return "no drafter count keeps it local for these targets on these hosts";
}

// How many targets and drafters each host gets, and which target / drafter indices (see rankfile_place).
struct HostShare {
  std::vector<int> target_idx, drafter_idx;
};

std::vector<HostShare> shares_by_class(const std::vector<HostTopo>& hosts, int targets, int drafters) {
  const int g = std::gcd(targets, drafters), tc = targets / g, dc = drafters / g, size = tc + dc;
  std::vector<HostShare> out(hosts.size());
  auto add_class = [&](HostShare& s, int c) {
    for (int j = 0; j < tc; ++j) s.target_idx.push_back(c + j * g);
    for (int j = 0; j < dc; ++j) s.drafter_idx.push_back(c + j * g);
  };
  int next = 0;
  std::vector<int> spare;
  for (size_t h = 0; h < hosts.size(); ++h) {
    const int cap = static_cast<int>(hosts[h].gpus.size());
    const int whole = std::min(g - next, cap / size);
    for (int k = 0; k < whole; ++k) add_class(out[h], next++);
    spare.push_back(cap - whole * size);
  }
  if (next == g) return out;
  // Classes that no host holds whole: their ranks fill the spare GPUs host by host, class after class, so
  // each class is cut at as few host boundaries as the capacities allow.
  HostShare rest;
  for (int c = next; c < g; ++c) add_class(rest, c);
  int left = static_cast<int>(rest.target_idx.size() + rest.drafter_idx.size());
  const int total = left;
  std::vector<int> ranks_on;
  for (int s : spare) {
    ranks_on.push_back(std::min(left, s));
    left -= ranks_on.back();
  }
  std::vector<int> d_on = drafter_shares(ranks_on, static_cast<int>(rest.drafter_idx.size()), total);
  size_t ti = 0, di = 0;
  for (size_t h = 0; h < hosts.size(); ++h) {
    for (int k = 0; k < ranks_on[h] - d_on[h]; ++k) out[h].target_idx.push_back(rest.target_idx[ti++]);
    for (int k = 0; k < d_on[h]; ++k) out[h].drafter_idx.push_back(rest.drafter_idx[di++]);
  }
  return out;
}

}  // namespace

const char* rank_role_name(RankRole r) {
  return r == RankRole::drafter ? "drafter" : "target";
}

std::vector<RankfileEntry> rankfile_place(const std::vector<HostTopo>& hosts, int targets, int drafters,
                                          std::vector<std::string>& warnings) {
  DF_CHECK(targets >= 1, "--targets %d: at least one target rank is needed to produce hidden states",
           targets);
  DF_CHECK(drafters >= 1, "--drafters %d: at least one drafter rank is needed to train", drafters);
  DF_CHECK(!hosts.empty(), "no hosts to place ranks on");
  int total = targets + drafters, gpus = 0;
  std::string per_host;
  for (const HostTopo& h : hosts) {
    gpus += static_cast<int>(h.gpus.size());
    per_host += strfmt("%s%s=%zu", per_host.empty() ? "" : ", ", h.host.c_str(), h.gpus.size());
  }
  DF_CHECK(total <= gpus,
           "%s + %s = %d ranks but only %d GPUs (%s): one rank needs one GPU; "
           "lower --targets/--drafters or add hosts",
           count_noun(targets, "target").c_str(), count_noun(drafters, "drafter").c_str(), total, gpus,
           per_host.c_str());
  std::vector<HostShare> shares = shares_by_class(hosts, targets, drafters);
  std::vector<RankfileEntry> out;
  for (size_t hi = 0; hi < hosts.size(); ++hi) {
    const HostTopo& h = hosts[hi];
    HostShare& share = shares[hi];
    const int t = static_cast<int>(share.target_idx.size()), d = static_cast<int>(share.drafter_idx.size());
    if (t + d == 0) {
      warnings.push_back(strfmt("host %s (%zu GPUs) gets no rank: the hosts before it hold all %d",
                                h.host.c_str(), h.gpus.size(), total));
      continue;
    }
    std::sort(share.target_idx.begin(), share.target_idx.end());
    std::sort(share.drafter_idx.begin(), share.drafter_idx.end());
    std::map<int, std::string> slots = slots_by_gpu(h, warnings);
    size_t ti = 0, di = 0;
    for (auto [gpu, role] : place_on_host(h, t, d)) {
      RankfileEntry e;
      e.rank = static_cast<int>(out.size());
      e.host = h.host;
      e.slot = slots[gpu];
      e.role = role;
      e.gpu = gpu;
      e.numa = h.gpus[gpu].numa;
      e.index = role == RankRole::target ? share.target_idx[ti++] : share.drafter_idx[di++];
      out.push_back(std::move(e));
    }
  }
  FeatureTraffic traffic = rankfile_feature_traffic(out);
  if (traffic.cross_pairs > 0) {
    const int g = std::gcd(targets, drafters);
    warnings.push_back(strfmt(
        "%s + %s cannot keep every target's batches on its host: batch b -> target b %% %d "
        "-> drafter b %% %d makes %d group(s) of %d target(s) + %d drafter(s) that exchange features, and "
        "not "
        "every group fits a host whole, so %.1f%% of the feature traffic crosses hosts; HINT: %s",
        count_noun(targets, "target").c_str(), count_noun(drafters, "drafter").c_str(), targets, drafters, g,
        targets / g, drafters / g, 100 * traffic.cross_share, local_hint(hosts, targets, drafters).c_str()));
  }
  return out;
}

std::string rankfile_format(const std::vector<RankfileEntry>& entries) {
  int d = 0;
  std::set<std::string> hosts;
  for (const RankfileEntry& e : entries) {
    d += e.role == RankRole::drafter;
    hosts.insert(e.host);
  }
  std::string out = strfmt(
      "# Open MPI rankfile from `dflash_mpi topo rankfile`: targets=%zu drafters=%d hosts=%zu\n"
      "# slot = cores of the node, each GPU bound to an equal share of its NUMA node's cores.\n"
      "# index = target / drafter index: batch b goes to target b %% T, then to drafter b %% D.\n",
      entries.size() - d, d, hosts.size());
  for (const RankfileEntry& e : entries) {
    out += strfmt("rank %d=%s slot=%s  # role=%s gpu=%d numa=%d", e.rank, e.host.c_str(), e.slot.c_str(),
                  rank_role_name(e.role), e.gpu, e.numa);
    out += e.index >= 0 ? strfmt(" index=%d", e.index) : "";
    out += e.pinned ? " pinned\n" : "\n";
  }
  return out;
}

std::vector<int> rankfile_role_ranks(const std::vector<RankfileEntry>& entries, RankRole role) {
  std::vector<std::pair<int, int>> keyed;  // (index or rank, rank)
  for (const RankfileEntry& e : entries)
    if (e.role == role) keyed.push_back({e.index >= 0 ? e.index : e.rank, e.rank});
  std::sort(keyed.begin(), keyed.end());
  std::vector<int> out;
  for (auto [key, rank] : keyed) out.push_back(rank);
  return out;
}

FeatureTraffic rankfile_feature_traffic(const std::vector<RankfileEntry>& entries,
                                        const std::vector<HostTopo>& hosts) {
  std::map<int, const RankfileEntry*> by_rank;
  for (const RankfileEntry& e : entries) by_rank[e.rank] = &e;
  std::map<std::string, const HostTopo*> host_of;
  for (const HostTopo& h : hosts) host_of[h.host] = &h;
  std::vector<int> ts = rankfile_role_ranks(entries, RankRole::target);
  std::vector<int> ds = rankfile_role_ranks(entries, RankRole::drafter);
  FeatureTraffic f;
  f.targets = static_cast<int>(ts.size());
  f.drafters = static_cast<int>(ds.size());
  if (ts.empty() || ds.empty()) return f;
  const int g = std::gcd(f.targets, f.drafters);
  for (int t = 0; t < f.targets; ++t)
    for (int d = t % g; d < f.drafters; d += g) {
      ++f.pairs;
      const RankfileEntry &te = *by_rank[ts[t]], &de = *by_rank[ds[d]];
      if (te.host != de.host) {
        ++f.cross_pairs;
        continue;
      }
      auto h = host_of.find(te.host);
      if (h == host_of.end()) continue;
      const bool on_host =
          te.gpu >= 0 && de.gpu >= 0 && size_t(std::max(te.gpu, de.gpu)) < h->second->gpus.size();
      switch (on_host ? topo_gpu_path(*h->second, te.gpu, de.gpu) : GpuPath::unknown) {
        case GpuPath::nvlink:
          ++f.nvlink_pairs;
          break;
        case GpuPath::node:
          ++f.node_pairs;
          break;
        case GpuPath::sys:
          ++f.sys_pairs;
          break;
        default:
          ++f.unknown_pairs;
      }
    }
  f.cross_share = static_cast<double>(f.cross_pairs) / f.pairs;
  for (int rank : ds) {
    const RankfileEntry& de = *by_rank[rank];
    auto h = host_of.find(de.host);
    if (h == host_of.end() || de.gpu < 0 || size_t(de.gpu) >= h->second->gpus.size()) {
      f.drafter_link_bytes_per_s = 0;
      f.drafter_link.clear();
      break;
    }
    const GpuInfo& gi = h->second->gpus[size_t(de.gpu)];
    const double bw = topo_pcie_bytes_per_s(gi);
    if (bw <= 0) {
      f.drafter_link_bytes_per_s = 0;
      f.drafter_link.clear();
      break;
    }
    if (f.drafter_link_bytes_per_s == 0 || bw < f.drafter_link_bytes_per_s) {
      f.drafter_link_bytes_per_s = bw;
      f.drafter_link = topo_pcie_name(gi);
    }
  }
  return f;
}

std::string feature_traffic_format(const FeatureTraffic& f, double batches_per_s, double batch_bytes) {
  std::string out = strfmt(
      "feature traffic: %d of %d target->drafter pairs cross hosts: %.1f%% of the feature bytes (batch b -> "
      "target b %% %d -> drafter b %% %d)\n",
      f.cross_pairs, f.pairs, 100 * f.cross_share, f.targets, f.drafters);
  const int local = f.nvlink_pairs + f.node_pairs + f.sys_pairs + f.unknown_pairs;
  if (local > 0)
    out += strfmt(
        "paths on a host: %d NVLink, %d NODE (PCIe within a NUMA node), %d SYS (PCIe across NUMA nodes, over "
        "the "
        "inter-socket link), %d unknown; a SYS pair carries %.1f%% of the feature bytes\n",
        f.nvlink_pairs, f.node_pairs, f.sys_pairs, f.unknown_pairs, 100.0 / f.pairs);
  if (batches_per_s > 0 && batch_bytes > 0) {
    out += strfmt(
        "at %.4g batches/s x %.4g B per batch: %.4g GB/s across hosts (%.4g GB/s of features in all)\n",
        batches_per_s, batch_bytes, f.cross_share * batches_per_s * batch_bytes * 1e-9,
        batches_per_s * batch_bytes * 1e-9);
    // Every byte a drafter trains on enters through its own link, whatever path it took before.
    const double per_drafter = batches_per_s / f.drafters * batch_bytes;
    if (f.nvlink_pairs < local && f.drafter_link_bytes_per_s > 0)
      out += strfmt(
          "each drafter receives %.4g GB/s of features: %.1f%% of its %s link (%.1f GB/s a direction)\n",
          per_drafter * 1e-9, 100 * per_drafter / f.drafter_link_bytes_per_s, f.drafter_link.c_str(),
          f.drafter_link_bytes_per_s * 1e-9);
  }
  return out;
}

}  // namespace df
