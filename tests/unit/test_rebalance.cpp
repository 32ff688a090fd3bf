// Role rebalancing without MPI: the split chosen from rates (global batch kept, pins respected, the advice
// always a split the move accepts and the end-of-run table's recommendation), the controller's hysteresis
// (warm-up, window, dwell, margin: alternating rates give at most one move), which ranks a move picks (the
// rankfile writer's rules), the role map after a move, the records, and the config keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/error.h"
#include "comm/dist.h"
#include "pipeline/rebalance.h"
#include "topo/rankfile.h"
#include "topo/role_move.h"

using namespace df;

namespace {

RebalanceLimits limits(int t, int d, int ga, int min_t = 1, int max_t = -1) {
  RebalanceLimits l;
  l.gpus = t + d;
  l.targets = t;
  l.drafters = d;
  l.grad_accum = ga;
  l.range.min_targets = min_t;
  l.range.max_targets = max_t > 0 ? max_t : t + d - 1;
  return l;
}

PipelineSection fast_settings(const std::string& mode = "auto") {
  PipelineSection p;
  p.rebalance = mode;
  p.rebalance_warmup_steps = 5;
  p.rebalance_window_steps = 10;
  p.rebalance_dwell_steps = 40;
  p.rebalance_margin = 0.10;
  return p;
}

// Runs the controller over `steps` steps as a job would: per-batch busy times from rates(step), D x ga
// batches a step, and a move taking effect one step after it is decided, as the new segment's start. Returns
// the moves.
template <class Rates>
std::vector<RebalanceEvent> simulate(int t, int d, int ga, int64_t steps, const PipelineSection& cfg,
                                     Rates rates) {
  std::vector<RebalanceEvent> moves;
  auto ctl = std::make_unique<Rebalancer>(cfg, limits(t, d, ga), 0);
  int64_t move_at = -1;
  for (int64_t s = 0; s < steps; ++s) {
    if (s == move_at) {  // the new roles start with step s
      t = moves.back().new_targets;
      d = moves.back().new_drafters;
      ga = moves.back().new_grad_accum;
      ctl = std::make_unique<Rebalancer>(cfg, limits(t, d, ga), s);
    }
    const auto [t_cost, d_cost] = rates(s);  // seconds of busy time per batch on a target / a drafter
    const double batches = double(d) * ga;
    for (const RebalanceEvent& e : ctl->observe(s, batches, batches * t_cost, batches * d_cost))
      if (e.kind == RebalanceEvent::Kind::move) {
        moves.push_back(e);
        move_at = s + 2;
      }
  }
  return moves;
}

}  // namespace

TEST(Rebalance, SlowTargetsChooseMoreTargetsAndKeepTheGlobalBatch) {
  // Targets 1 batch/s, drafters 4: 2-2 runs at 2, 3-1 at 3 (+50 %); 2 drafters x ga 1 = 1 drafter x ga 2.
  std::vector<RebalanceEvent> ev = rebalance_choose(1.0, 4.0, limits(2, 2, 1), 0.10, 100);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, RebalanceEvent::Kind::advise);
  EXPECT_EQ(ev[0].new_targets, 3);
  EXPECT_EQ(ev[0].new_drafters, 1);
  EXPECT_EQ(ev[0].new_grad_accum, 2);
  EXPECT_DOUBLE_EQ(ev[0].predicted_now, 2.0);
  EXPECT_DOUBLE_EQ(ev[0].predicted_new, 3.0);
}

TEST(Rebalance, ASplitThatCannotKeepTheGlobalBatchIsRefusedAndSaysSo) {
  // Drafters slow: 1-3 is best (3 vs 2), but 2 micro-batches a step do not split over 3 drafters, and the
  // next best is the current split: only the refusal.
  std::vector<RebalanceEvent> ev = rebalance_choose(4.0, 1.0, limits(2, 2, 1), 0.10, 100);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, RebalanceEvent::Kind::refused);
  EXPECT_EQ(ev[0].new_drafters, 3);
  EXPECT_NE(ev[0].reason.find("does not split over 3 drafters"), std::string::npos) << ev[0].reason;
  EXPECT_NE(rebalance_event_json(ev[0]).find("\"rebalance_refused\""), std::string::npos);
  // With 6 micro-batches (2 x ga 3) the same rates move to 1-3 with grad_accum 2.
  ev = rebalance_choose(4.0, 1.0, limits(2, 2, 3), 0.10, 100);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, RebalanceEvent::Kind::advise);
  EXPECT_EQ(ev[0].new_grad_accum, 2);
  // 8 ranks, 2-6 with ga 1 (6 micro-batches) and targets 1 b/s, drafters 6: 7-1 (6) is best; 6-2 and 5-3
  // (both 5.x) come next. 7-1 keeps the batch (ga 6).
  ev = rebalance_choose(1.0, 6.0, limits(2, 6, 1), 0.10, 100);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].new_targets, 7);
  EXPECT_EQ(ev[0].new_grad_accum, 6);
}

TEST(Rebalance, PinsLimitTheSplitsAMoveMayReach) {
  // 3-1 is best but pins keep at most 2 targets: refused, and nothing else beats 2-2 by the margin.
  std::vector<RebalanceEvent> ev = rebalance_choose(1.0, 4.0, limits(2, 2, 1, 1, 2), 0.10, 100);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, RebalanceEvent::Kind::refused);
  EXPECT_NE(ev[0].reason.find("pinned"), std::string::npos) << ev[0].reason;
}

TEST(Rebalance, TheAdviceIsNeverASplitTheMoveRefuses) {
  // The CPU demo: 2-1 with grad_accum 1, targets 118 and the drafter 35.6 batches/s. 1-2 would run at 71.2,
  // but 1 micro-batch a step cannot split over 2 drafters: a refusal and no advice, and the end-of-run table
  // (the same planner under the same limits) recommends the split the run keeps.
  const RebalanceLimits demo = limits(2, 1, 1);
  std::vector<RebalanceEvent> ev = rebalance_choose(118, 35.6, demo, 0.10, 2148);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, RebalanceEvent::Kind::refused);
  EXPECT_EQ(ev[0].new_drafters, 2);
  const SplitPlan table = plan_split_compute(118, 35.6, demo.gpus, rebalance_split_limits(demo));
  EXPECT_EQ(table.rows[size_t(table.best)].targets, 2);
  EXPECT_NE(plan_split_format(table, "batches/s").find("recommendation: 2-1"), std::string::npos);
  // Over many rates and limits: every advice is a split the move accepts (the global batch divides over its
  // drafters, the pins allow its targets), it is the table's recommendation, and every refusal beats it.
  int advised = 0;
  for (int t = 1; t < 8; ++t)
    for (int ga : {1, 2, 3})
      for (double rd : {0.3, 1.0, 2.5, 7.0})
        for (int max_t : {4, 7}) {
          const RebalanceLimits lim = limits(t, 8 - t, ga, 1, std::max(max_t, t));
          const SplitPlan p = plan_split_compute(1.0, rd, lim.gpus, rebalance_split_limits(lim));
          for (const RebalanceEvent& e : rebalance_choose(1.0, rd, lim, 0.10, 100)) {
            const std::string at = strfmt("%d-%d ga %d rd %g max %d -> %d-%d", t, 8 - t, ga, rd, max_t,
                                          e.new_targets, e.new_drafters);
            if (e.kind == RebalanceEvent::Kind::refused) {
              EXPECT_FALSE(e.reason.empty()) << at;
              continue;
            }
            ++advised;
            EXPECT_EQ(((8 - t) * ga) % e.new_drafters, 0) << at;
            EXPECT_EQ(e.new_grad_accum * e.new_drafters, (8 - t) * ga) << at;
            EXPECT_LE(e.new_targets, lim.range.max_targets) << at;
            ASSERT_GE(p.best, 0) << at;
            EXPECT_EQ(e.new_targets, p.rows[size_t(p.best)].targets) << at;
          }
        }
  EXPECT_GT(advised, 20);
}

TEST(Rebalance, AGainWithinTheMarginIsNoMove) {
  // 2-2 at min(2 x 1, 2 x 1.08) = 2; 3-1 at min(3, 1.08 x 1 ... ) is worse; 1-3 too: nothing.
  EXPECT_TRUE(rebalance_choose(1.0, 1.08, limits(2, 2, 1), 0.10, 100).empty());
  // 3-1 predicted 7.5 % over 2-2 (rd = 2.15: 3-1 = min(3, 2.15) = 2.15 vs 2): under the 10 % margin.
  EXPECT_TRUE(rebalance_choose(1.0, 2.15, limits(2, 2, 1), 0.10, 100).empty());
  EXPECT_EQ(rebalance_choose(1.0, 2.15, limits(2, 2, 1), 0.05, 100).size(), 1u);
}

TEST(Rebalance, MovesOnlyAfterWarmupWindowAndDwell) {
  const PipelineSection cfg = fast_settings();
  std::vector<RebalanceEvent> moves = simulate(2, 2, 1, 200, cfg, [](int64_t) {
    return std::pair{1.0, 0.25};
  });
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].step, cfg.rebalance_dwell_steps);  // the first step the dwell allows
  EXPECT_EQ(moves[0].new_targets, 3);
  EXPECT_EQ(moves[0].window_steps, cfg.rebalance_window_steps);
  // "advise" reports the same split once and moves nothing.
  Rebalancer adv(fast_settings("advise"), limits(2, 2, 1), 0);
  int advice = 0;
  for (int64_t s = 0; s < 200; ++s)
    for (const RebalanceEvent& e : adv.observe(s, 2, 2 * 1.0, 2 * 0.25)) {
      EXPECT_EQ(e.kind, RebalanceEvent::Kind::advise);
      ++advice;
    }
  EXPECT_EQ(advice, 1);
  Rebalancer off(fast_settings("off"), limits(2, 2, 1), 0);
  for (int64_t s = 0; s < 200; ++s) EXPECT_TRUE(off.observe(s, 2, 2.0, 0.5).empty());
}

TEST(Rebalance, AlternatingRatesMakeAtMostOneMove) {
  const PipelineSection cfg = fast_settings();
  // Each step alone favours the opposite extreme (targets 4x slower than drafters, then 4x faster): the
  // window sees the mean, which is balanced, so a 3-1 start moves once, to 2-2, and stays there.
  auto every_step = [](int64_t s) { return s % 2 ? std::pair{1.0, 0.25} : std::pair{0.25, 1.0}; };
  std::vector<RebalanceEvent> moves = simulate(3, 1, 2, 2000, cfg, every_step);
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].new_targets, 2);
  EXPECT_TRUE(simulate(2, 2, 1, 2000, cfg, every_step).empty());
  // Phases shorter than the window (7 steps each way): the windowed means stay inside the margin of balance.
  auto phases = [](int64_t s) { return (s / 7) % 2 ? std::pair{1.0, 0.25} : std::pair{0.25, 1.0}; };
  for (int t : {1, 2, 3}) {
    const int d = 4 - t;
    moves = simulate(t, d, 6 / d, 2000, cfg, phases);
    EXPECT_LE(moves.size(), 1u) << "start " << t << "-" << d;
  }
}

TEST(RoleMove, ADrafterBecomesATargetButNeverDrafterZeroOrAPinnedRank) {
  // [topology] 2-2 on one host: targets 0 1, drafters 2 (drafter 0) 3.
  std::vector<RoleSlot> r(4);
  for (int i = 0; i < 4; ++i)
    r[size_t(i)] = RoleSlot{i < 2 ? RankRole::target : RankRole::drafter, "h", -1, -1, false};
  EXPECT_EQ(role_move_pick(r, 2, 3), (std::vector<int>{3}));
  r[3].pinned = true;
  EXPECT_EQ(role_move_range(r, 2).max_targets, 2);
  try {
    role_move_pick(r, 2, 3);
    FAIL() << "a pinned drafter was moved";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 (drafter, pinned)"), std::string::npos) << e.what();
  }
}

TEST(RoleMove, ANewDrafterJoinsTheDraftersNumaNodeOnTheLastGpu) {
  // 8 GPUs, NUMA 0 = GPUs 0-3, NUMA 1 = 4-7; 7-1 with the drafter on GPU 7 (rankfile_place's 7-1). To 6-2 the
  // new drafter is GPU 6 (same node, last free GPU); to 5-3 GPUs 6 and 5.
  std::vector<RoleSlot> r(8);
  for (int i = 0; i < 8; ++i)
    r[size_t(i)] = RoleSlot{i == 7 ? RankRole::drafter : RankRole::target, "h", i / 4, i, false};
  EXPECT_EQ(role_move_pick(r, 7, 6), (std::vector<int>{6}));
  EXPECT_EQ(role_move_pick(r, 7, 5), (std::vector<int>{6, 5}));
  // Back from 4-4 (drafters 4-7, drafter 0 = GPU 7) to 7-1: drafters leave from the first GPU.
  for (int i = 0; i < 8; ++i) r[size_t(i)].role = i >= 4 ? RankRole::drafter : RankRole::target;
  EXPECT_EQ(role_move_pick(r, 7, 7), (std::vector<int>{4, 5, 6}));
}

TEST(RoleMove, TwoHostsKeepDraftersInProportion) {
  // Two hosts of 4, 6-2 with one drafter on each host's last GPU: to 4-4 each host gets one more.
  std::vector<RoleSlot> r(8);
  for (int i = 0; i < 8; ++i)
    r[size_t(i)] =
        RoleSlot{i % 4 == 3 ? RankRole::drafter : RankRole::target, i < 4 ? "a" : "b", -1, i % 4, false};
  std::vector<int> moved = role_move_pick(r, 3, 4);
  std::sort(moved.begin(), moved.end());
  EXPECT_EQ(moved, (std::vector<int>{2, 6}));
}

TEST(RoleMove, TheRoleMapKeepsEveryIndexButTheMovedRanks) {
  RoleMap m;
  m.role = {RankRole::target, RankRole::target, RankRole::drafter, RankRole::drafter};
  m.targets = {0, 1};
  m.drafters = {2, 3};
  m.hosts.assign(4, "h");
  m.gpu.assign(4, -1);
  m.numa.assign(4, -1);
  m.pinned.assign(4, false);
  RoleMap n = roles_after_move(m, {3});
  EXPECT_EQ(n.targets, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(n.drafters, (std::vector<int>{2}));
  EXPECT_EQ(n.role[3], RankRole::target);
  EXPECT_EQ(roles_label(n, 3), "3=target2");
  roles_pin(m, {1});
  EXPECT_TRUE(m.pinned[1]);
  try {
    roles_pin(m, {4});
    FAIL() << "rank 4 of 4 pinned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.rebalance_pinned"), std::string::npos) << e.what();
  }
}

TEST(RoleMove, RankfilePinnedRoundTrips) {
  std::vector<RankfileEntry> e = rankfile_parse_text(
      "rank 0=h slot=0  # role=target gpu=0 pinned\nrank 1=h slot=1  # role=drafter gpu=1\n", "t.rf");
  EXPECT_TRUE(e[0].pinned);
  EXPECT_FALSE(e[1].pinned);
  EXPECT_EQ(rankfile_parse_text(rankfile_format(e), "again.rf")[0].pinned, true);
}

TEST(Rebalance, TheMoveRecordCarriesStepSplitsAndRates) {
  RebalanceEvent e = rebalance_choose(1.0, 4.0, limits(2, 2, 1), 0.10, 99)[0];
  e.kind = RebalanceEvent::Kind::move;
  e.moved_at = 100;
  e.moved = {3};
  e.window_steps = 50;
  const nlohmann::json j = nlohmann::json::parse(rebalance_event_json(e));
  EXPECT_EQ(j["event"], "rebalance");
  EXPECT_EQ(j["step"], 100);
  EXPECT_EQ(j["from"], "2-2");
  EXPECT_EQ(j["to"], "3-1");
  EXPECT_EQ(j["grad_accum_to"], 2);
  EXPECT_DOUBLE_EQ(j["target_rate"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["predicted_new"].get<double>(), 3.0);
  EXPECT_EQ(j["moved_ranks"], nlohmann::json::array({3}));
  EXPECT_NE(rebalance_event_text(e).find("moving 2-2 -> 3-1 after step 100"), std::string::npos);
}

TEST(Rebalance, ConfigKeysAreCheckedByName) {
  const std::string base =
      "[target]\nrandom_config = \"x.json\"\ndevice = \"cpu\"\n[drafter]\nmask_token_id = 1\n";
  auto error_of = [&](const std::string& pipeline) -> std::string {
    try {
      config_parse(base + "[pipeline]\n" + pipeline, "t.toml");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  Config c = config_parse(base, "t.toml");
  EXPECT_EQ(c.pipeline.rebalance, "advise");
  EXPECT_DOUBLE_EQ(c.pipeline.rebalance_margin, 0.10);
  EXPECT_NE(error_of("rebalance = \"yes\"\n").find("pipeline.rebalance'"), std::string::npos);
  EXPECT_NE(error_of("rebalance_margin = 0\n").find("pipeline.rebalance_margin"), std::string::npos);
  EXPECT_NE(error_of("rebalance_window_steps = 0\n").find("pipeline.rebalance_window_steps"),
            std::string::npos);
  EXPECT_NE(error_of("rebalance_warmup_steps = -1\n").find("pipeline.rebalance_warmup_steps"),
            std::string::npos);
  EXPECT_NE(error_of("rebalance_dwell_steps = 10\n").find("pipeline.rebalance_dwell_steps"),
            std::string::npos);
  EXPECT_NE(error_of("rebalance_pinned = [1, 1]\n").find("pipeline.rebalance_pinned"), std::string::npos);
  EXPECT_NE(error_of("test_target_delay_s = -1\n").find("pipeline.test_target_delay_s"), std::string::npos);
  EXPECT_EQ(error_of("rebalance = \"auto\"\nrebalance_pinned = [0, 3]\ntest_target_delay_s = 0.5\n"), "");
}
