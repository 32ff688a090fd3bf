// Picking the ranks of a role move; see role_move.h.
#include "topo/role_move.h"

#include <cmath>
#include <map>
#include <tuple>

#include "core/error.h"

namespace df {

namespace {

bool movable(const std::vector<RoleSlot>& ranks, int r, int keep) {
  return !ranks[size_t(r)].pinned && r != keep;
}

// (host-share deviation, targets beside a drafter on a known NUMA node): lower is closer to rankfile_place.
std::pair<double, int> placement_cost(const std::vector<RoleSlot>& ranks) {
  const int n = int(ranks.size());
  int drafters = 0;
  std::map<std::string, std::pair<int, int>> per_host;                  // ranks, drafters
  std::map<std::pair<std::string, int>, std::pair<int, int>> per_numa;  // targets, drafters
  for (const RoleSlot& s : ranks) {
    const bool d = s.role == RankRole::drafter;
    drafters += d;
    per_host[s.host].first += 1;
    per_host[s.host].second += d;
    if (s.numa >= 0) (d ? per_numa[{s.host, s.numa}].second : per_numa[{s.host, s.numa}].first) += 1;
  }
  double deviation = 0;
  for (const auto& [host, c] : per_host) deviation += std::fabs(c.second - double(drafters) * c.first / n);
  int mixed = 0;
  for (const auto& [node, c] : per_numa) mixed += c.second > 0 ? c.first : 0;
  return {deviation, mixed};
}

}  // namespace

RoleRange role_move_range(const std::vector<RoleSlot>& ranks, int keep) {
  int targets = 0, fixed_targets = 0, fixed_drafters = 0;
  for (int r = 0; r < int(ranks.size()); ++r) {
    const bool t = ranks[size_t(r)].role == RankRole::target;
    targets += t;
    if (!movable(ranks, r, keep)) (t ? fixed_targets : fixed_drafters) += 1;
  }
  RoleRange out;
  out.min_targets = std::max(1, fixed_targets);
  out.max_targets = int(ranks.size()) - std::max(1, fixed_drafters);
  return out;
}

std::vector<int> role_move_pick(const std::vector<RoleSlot>& ranks, int keep, int new_targets) {
  const RoleRange range = role_move_range(ranks, keep);
  if (new_targets < range.min_targets || new_targets > range.max_targets) {
    std::string fixed;
    for (int r = 0; r < int(ranks.size()); ++r)
      if (!movable(ranks, r, keep))
        fixed += strfmt("%s%d (%s%s)", fixed.empty() ? "" : ", ", r, rank_role_name(ranks[size_t(r)].role),
                        r == keep ? ", drafter 0: holds the run dir" : ", pinned");
    DF_FAIL(
        "a move to %d targets of %zu ranks is impossible: the split must keep %d..%d targets because these "
        "ranks keep their role: %s; HINT: drop `pinned` from the rankfile or pipeline.rebalance_pinned",
        new_targets, ranks.size(), range.min_targets, range.max_targets, fixed.c_str());
  }
  std::vector<RoleSlot> now = ranks;
  int targets = 0;
  for (const RoleSlot& s : now) targets += s.role == RankRole::target;
  std::vector<int> moved;
  while (targets != new_targets) {
    // More targets: a drafter becomes one; fewer: a target becomes a drafter.
    const RankRole from = targets < new_targets ? RankRole::drafter : RankRole::target;
    int best = -1;
    std::tuple<double, int, int, int> best_key{};
    for (int r = 0; r < int(now.size()); ++r) {
      if (now[size_t(r)].role != from || !movable(now, r, keep)) continue;
      now[size_t(r)].role = from == RankRole::drafter ? RankRole::target : RankRole::drafter;
      const auto [deviation, mixed] = placement_cost(now);
      now[size_t(r)].role = from;
      // A new drafter goes to the last GPU (rankfile_place's tie), a drafter given back leaves the first.
      const int g = now[size_t(r)].gpu;
      const std::tuple<double, int, int, int> key = from == RankRole::target
                                                        ? std::make_tuple(deviation, mixed, -g, -r)
                                                        : std::make_tuple(deviation, mixed, g, r);
      if (best < 0 || key < best_key) {
        best = r;
        best_key = key;
      }
    }
    now[size_t(best)].role = from == RankRole::drafter ? RankRole::target : RankRole::drafter;
    targets += from == RankRole::drafter ? 1 : -1;
    moved.push_back(best);
  }
  return moved;
}

}  // namespace df
