// Which ranks change role when a running job moves to another target:drafter split (pipeline/rebalance.h),
// chosen by the rules `topo rankfile` places roles by, so a re-formed job looks like one started from a
// fresh rankfile for the new counts wherever the ranks already stand.
#pragma once
#include <string>
#include <vector>

#include "topo/rankfile.h"

namespace df {

// One world rank as the move sees it.
struct RoleSlot {
  RankRole role = RankRole::target;
  std::string host;
  int numa = -1;        // -1: unknown
  int gpu = -1;         // -1: unknown (CPU ranks); ties then go by rank
  bool pinned = false;  // `pinned` in the rankfile or pipeline.rebalance_pinned: never moves
};

// How many targets a move may reach: every rank that may change role (not pinned, and not `keep`, the
// checkpoint owner, drafter 0, which holds the run dir's lock and the metrics) can. At least one of each
// role.
struct RoleRange {
  int min_targets = 1, max_targets = 1;
};
RoleRange role_move_range(const std::vector<RoleSlot>& ranks, int keep);

// The ranks that change role to reach `new_targets`, one at a time, each the one whose move leaves (1) every
// host's drafters closest to its share of the ranks (rankfile_place gives drafters to hosts in proportion),
// then (2) the fewest targets sharing a known NUMA node with a drafter (drafters apart from target traffic),
// then (3) as rankfile_place's ties: a new drafter on the last GPU (highest gpu, then rank), a drafter given
// back from the first. Throws, naming the pinned ranks, when new_targets is outside role_move_range.
std::vector<int> role_move_pick(const std::vector<RoleSlot>& ranks, int keep, int new_targets);

}  // namespace df
