// Open MPI rankfiles with role annotations: the placement that writes them (targets and drafters on GPUs,
// each rank bound to its GPU's local cores) and the parser the training bootstrap reads them back with.
// Line form: `rank N=HOST slot=LIST  # role=target gpu=G numa=M` (Open MPI 4.1 accepts the trailing comment).
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
  int gpu = -1;      // -1: absent; the bootstrap then uses the rank's index among ranks on its host
  int numa = -1;     // -1: absent or unknown
};

// Places `targets` + `drafters` ranks on the hosts in order, filling each host's GPUs before the next.
// Each used host gets drafters in proportion to its ranks; on a host, drafters go to the NUMA groups
// that leave the fewest targets sharing a node with them (ties: the last groups, last GPUs), targets to
// the other GPUs lowest first. A NUMA node's cores are split evenly among its GPUs. Ranks on a host are
// numbered in GPU order. Throws on impossible requests; appends notes (shared cores ...) to `warnings`.
std::vector<RankfileEntry> rankfile_place(const std::vector<HostTopo>& hosts, int targets, int drafters,
                                          std::vector<std::string>& warnings);

// The rankfile text: a header comment, then one line per rank.
std::string rankfile_format(const std::vector<RankfileEntry>& entries);

// Parses a rankfile (see the line form above). Full-line comments and blank lines are skipped; trailing
// `# key=value` annotations give role (required), gpu and numa; unknown keys are ignored. Errors name
// `name:line`. Entries come back sorted by rank, which must run 0..N-1 without gaps or repeats.
std::vector<RankfileEntry> rankfile_parse(const std::string& path);
std::vector<RankfileEntry> rankfile_parse_text(const std::string& text, const std::string& name);

}  // namespace df
