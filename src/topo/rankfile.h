// Open MPI rankfiles with role annotations: the placement that writes them (targets and drafters on GPUs,
// each rank bound to its GPU's local cores) and the parser the training bootstrap reads them back with.
// Line form: `rank N=HOST slot=LIST  # role=target gpu=G numa=M index=I` (Open MPI 4.1 accepts the trailing
// comment).
#pragma once
#include <string>
#include <vector>

#include "topo/topo.h"

namespace df {

enum class RankRole { target, drafter };

const char* rank_role_name(RankRole r);

struct RankfileEntry {
  int rank = 0;
  std::string host;
  std::string slot;  // Open MPI slot list, e.g. "56-63" (cores of the node) or "1:0-7" (package:cores)
  RankRole role = RankRole::target;
  int gpu = -1;   // -1: absent; the bootstrap then uses the rank's index among ranks on its host
  int numa = -1;  // -1: absent or unknown
  int index = -1;  // position among the ranks of its role (target / drafter index); -1: absent, rank order
  bool pinned = false;  // `pinned`: a running job's role rebalancing never moves this rank (pipeline/rebalance.h)
};

// Places `targets` + `drafters` ranks on the hosts so that feature traffic stays on its host. Batch b goes
// to target b % T and then to drafter b % D, so target t feeds exactly the drafters d with d ≡ t (mod g),
// g = gcd(T, D): the ranks fall into g classes of T/g targets + D/g drafters with no traffic between
// classes. Each host, in order, takes as many whole classes as its GPUs hold; classes that fit no host
// whole fill the GPUs left, host by host, drafters in proportion to each host's ranks (and a warning says
// what share of the traffic then crosses hosts). On a host, drafters go to the NUMA groups that leave the
// fewest targets sharing a node with them (ties: the last groups, last GPUs), targets to the other GPUs
// lowest first. A NUMA node's cores are split evenly among its GPUs. Ranks on a host are numbered in GPU
// order, host after host; `index` carries each rank's target / drafter index. Throws on impossible
// requests; appends notes (shared cores, cross-host traffic ...) to `warnings`.
std::vector<RankfileEntry> rankfile_place(const std::vector<HostTopo>& hosts, int targets, int drafters,
                                          std::vector<std::string>& warnings);

// The rankfile text: a header comment, then one line per rank.
std::string rankfile_format(const std::vector<RankfileEntry>& entries);

// World ranks of one role in index order: by `index` where the entries carry it, else by rank.
std::vector<int> rankfile_role_ranks(const std::vector<RankfileEntry>& entries, RankRole role);

// Where the features of a placement flow. Every target→drafter pair that carries batches (d ≡ t mod g)
// carries the same share, g / (T·D), of all batches.
struct FeatureTraffic {
  int targets = 0, drafters = 0;
  int pairs = 0, cross_pairs = 0;  // pairs that carry batches; those whose two ranks sit on different hosts
  double cross_share = 0;          // share of all feature bytes that crosses hosts
  // With the hosts' topology: the pairs on one host by the path their bytes take (topo_gpu_path), and the
  // slowest PCIe link among the drafters' GPUs, which all feature bytes of a drafter enter through.
  int nvlink_pairs = 0, node_pairs = 0, sys_pairs = 0, unknown_pairs = 0;
  double drafter_link_bytes_per_s = 0;  // 0: unknown
  std::string drafter_link;             // e.g. "PCIe 5.0 x16"
};
// `hosts` (optional) are those the entries were placed on, matched by name, for the path counts.
FeatureTraffic rankfile_feature_traffic(const std::vector<RankfileEntry>& entries,
                                        const std::vector<HostTopo>& hosts = {});

// The traffic summary `topo rankfile` prints. With batches_per_s > 0 and batch_bytes > 0 it adds the bytes
// per second that cross hosts at that pipeline rate and, where the paths are PCIe, what each drafter receives
// against its link.
std::string feature_traffic_format(const FeatureTraffic& t, double batches_per_s, double batch_bytes);

// Parses a rankfile (see the line form above). Full-line comments and blank lines are skipped; trailing
// `# key=value` annotations give role (required), gpu, numa and index, and the bare word `pinned` keeps the
// rank's role through rebalancing; unknown keys are ignored. Errors
// name `name:line`. Entries come back sorted by rank, which must run 0..N-1 without gaps or repeats; index
// is on every line or none, and runs 0..n-1 within each role.
std::vector<RankfileEntry> rankfile_parse(const std::string& path);
std::vector<RankfileEntry> rankfile_parse_text(const std::string& text, const std::string& name);

}  // namespace df
