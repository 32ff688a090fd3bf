// Role resolution without MPI: the order of sources (rankfile, DFLASH_RANKFILE, Open MPI's rankfile variable,
// [topology], default), the default's one drafter per host, and the errors for maps that cannot run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "comm/dist.h"
#include "comm/host_watch.h"
#include "pipeline/metrics.h"

using namespace df;

namespace {

struct EnvGuard {  // clears the variables roles_resolve reads, before and after each test
  EnvGuard() {
    unsetenv("DFLASH_RANKFILE");
    unsetenv("OMPI_MCA_orte_rankfile");
  }
  ~EnvGuard() {
    unsetenv("DFLASH_RANKFILE");
    unsetenv("OMPI_MCA_orte_rankfile");
  }
};

std::string write_rankfile(const std::string& name, const std::string& text) {
  auto p = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(getpid()) + ".rf");
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace

TEST(Roles, DefaultIsOneDrafterPerHostOnItsLastRank) {
  EnvGuard env;
  RoleMap m = roles_resolve("", TopologySection{}, {"a", "a", "a", "b", "b", "b", "b"});
  EXPECT_EQ(m.drafters, (std::vector<int>{2, 6}));
  EXPECT_EQ(m.targets, (std::vector<int>{0, 1, 3, 4, 5}));
  EXPECT_NE(m.source.find("default"), std::string::npos);
}

TEST(Roles, TopologySectionPutsDraftersLast) {
  EnvGuard env;
  TopologySection t;
  t.targets = 3;
  t.drafters = 1;
  RoleMap m = roles_resolve("", t, {"a", "a", "a", "a"});
  EXPECT_EQ(m.drafters, (std::vector<int>{3}));
  t.targets = 4;
  try {
    roles_resolve("", t, {"a", "a", "a", "a"});
    FAIL() << "5 ranks of roles for a world of 4 were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 targets + 1 drafter = 5 ranks but 4 were started"),
              std::string::npos)
        << e.what();
  }
}

TEST(Roles, RankfileWinsAndCarriesGpus) {
  EnvGuard env;
  std::string rf = write_rankfile("roles", "rank 0=h slot=0 # role=drafter gpu=3\nrank 1=h slot=1 # role=target gpu=0\n");
  TopologySection t;
  t.targets = 1;
  t.drafters = 1;
  RoleMap m = roles_resolve(rf, t, {"h", "h"});
  EXPECT_EQ(m.drafters, (std::vector<int>{0}));
  EXPECT_EQ(m.gpu, (std::vector<int>{3, 0}));
  // The same file through the environment, and through Open MPI's variable.
  setenv("DFLASH_RANKFILE", rf.c_str(), 1);
  EXPECT_EQ(roles_resolve("", TopologySection{}, {"h", "h"}).drafters, (std::vector<int>{0}));
  unsetenv("DFLASH_RANKFILE");
  setenv("OMPI_MCA_orte_rankfile", rf.c_str(), 1);
  EXPECT_NE(roles_resolve("", TopologySection{}, {"h", "h"}).source.find("OMPI_MCA_orte_rankfile"),
            std::string::npos);
  // DFLASH_RANKFILE=none switches rankfiles off, Open MPI's too: back to the default (drafter = last rank).
  setenv("DFLASH_RANKFILE", "none", 1);
  EXPECT_EQ(roles_resolve("", TopologySection{}, {"h", "h"}).drafters, (std::vector<int>{1}));
  // A rankfile for another world size is refused with the fix.
  try {
    roles_resolve(rf, TopologySection{}, {"h", "h", "h"});
    FAIL() << "a 2-rank rankfile was accepted for 3 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("names 2 ranks but 3 were started"), std::string::npos) << e.what();
  }
  std::filesystem::remove(rf);
}

TEST(Roles, RankfileIndicesOrderTheRolesAndHostsAreChecked) {
  EnvGuard env;
  // `topo rankfile` numbers ranks host by host but gives target / drafter indices so each target feeds the
  // drafter on its host: here target 1 is rank 2 (on b) and drafter 1 is rank 3.
  std::string rf = write_rankfile("roles_index",
                                  "rank 0=a slot=0 # role=target index=0\n"
                                  "rank 1=a slot=1 # role=drafter index=0\n"
                                  "rank 2=b slot=0 # role=target index=1\n"
                                  "rank 3=b slot=1 # role=drafter index=1\n"
                                  "rank 4=a slot=0 # role=target index=2\n");
  RoleMap m = roles_resolve(rf, TopologySection{}, {"a", "a", "b", "b", "a"});
  EXPECT_EQ(m.targets, (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(m.drafters, (std::vector<int>{1, 3}));
  EXPECT_TRUE(m.host_mismatch.empty()) << m.host_mismatch;
  EXPECT_EQ(roles_by_host(m), "a [ranks 0=target0 1=drafter0 4=target2]; b [ranks 2=target1 3=drafter1]");
  EXPECT_EQ(
      host_watch_loss_message(m, {3, 2}).rfind("lost host b: ranks 2=target1 3=drafter1 (all 2 of its ranks) "
                                               "ended without finishing; the host went down",
                                               0),
      0u)
      << host_watch_loss_message(m, {3, 2});
  EXPECT_EQ(host_watch_loss_message(m, {4}).rfind("lost host a: rank 4=target2 (1 of its 3 ranks)", 0), 0u);
  EXPECT_EQ(host_watch_silence_message(m, {4, 1}).rfind("ranks 1=drafter0 on host a, 4=target2 on host a sent no "
                                                        "heartbeat for 30 s: stopped",
                                                        0),
            0u)
      << host_watch_silence_message(m, {4, 1});
  // A launcher that put the ranks elsewhere than the file says is noticed (rank 0 warns at start-up).
  RoleMap moved = roles_resolve(rf, TopologySection{}, {"a", "b", "b", "b", "a"});
  EXPECT_NE(moved.host_mismatch.find("puts rank 1 on a but it runs on b"), std::string::npos)
      << moved.host_mismatch;
  std::filesystem::remove(rf);
}

TEST(Roles, EveryRunNeedsATargetAndADrafter) {
  EnvGuard env;
  EXPECT_THROW(roles_resolve("", TopologySection{}, {"a"}), Error);  // one rank: a drafter, no target
  std::string rf = write_rankfile("roles_all_t", "rank 0=h slot=0 # role=target\nrank 1=h slot=1 # role=target\n");
  try {
    roles_resolve(rf, TopologySection{}, {"h", "h"});
    FAIL() << "a map without drafters was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no drafter rank"), std::string::npos) << e.what();
  }
  std::filesystem::remove(rf);
}

TEST(Metrics, StatsPackRoundTripAndTauEstimate) {
  StepStats s;
  s.loss_sum = 3;
  s.weight_sum = 2;
  s.correct = {4, 2, 1};
  s.count = {8, 8, 8};
  s.tokens = 100;
  StepStats t;
  t.unpack(s.pack(), 4);
  EXPECT_EQ(t.pack(), s.pack());
  t.add(s);
  EXPECT_DOUBLE_EQ(t.loss_sum, 6);
  EXPECT_EQ(t.correct, (std::vector<double>{8, 4, 2}));
  // τ = 1 + a1 + a1·a2 + a1·a2·a3 for independent offsets.
  EXPECT_DOUBLE_EQ(tau_from_accuracy({0.5, 0.5, 0.5}), 1 + 0.5 + 0.25 + 0.125);
  EXPECT_DOUBLE_EQ(tau_from_accuracy({}), 1.0);
}
