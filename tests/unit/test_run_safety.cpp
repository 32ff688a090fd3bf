// Run safety in-process: outputs never replace inputs (file_check_output), the run-dir lock and its
// stale-holder report, checkpoint lineage (rotation removes only the run's own files), the start rule that
// refuses checkpoints a start would overwrite and --fresh-start that moves them aside, and the watchdog's
// bound/message.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/file_util.h"
#include "comm/watchdog.h"
#include "test_data_util.h"
#include "test_drafter_util.h"
#include "train/checkpoint.h"
#include "train/run_dir.h"

namespace fs = std::filesystem;
using namespace df;
using df::testing::tiny_drafter_config;
using df_test::ScratchDir;

namespace {

void write_text(const std::string& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

std::string read_text(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The message of the df::Error that `f` throws ("" when it does not throw).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

CheckpointState state_at(int64_t step, const std::string& run_id) {
  CheckpointState s;
  s.step = step;
  s.batch_cursor = 2 * step;
  s.run_id = run_id;
  return s;
}

// A run dir whose checkpoints/ holds steps 4 and 6 of lineage "run-a", `latest` naming step 6.
struct RunWithCheckpoints {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel m{tiny_drafter_config(), ops};
  const std::string run = d.file("run"), ck = run + "/checkpoints";
  RunWithCheckpoints() {
    drafter_init_params(m, 1);
    for (int64_t s : {4, 6}) checkpoint_save(ck, m, state_at(s, "run-a"), 3);
  }
};

}  // namespace

TEST(FileCheckOutput, AnOutputThatIsAnInputIsRefusedEvenWithForce) {
  ScratchDir d;
  const std::string in = d.file("in.jsonl");
  write_text(in, "{}\n");
  fs::create_symlink(in, d.file("link.jsonl"));
  fs::create_hard_link(in, d.file("hard.jsonl"));
  fs::create_directories(d.file("sub"));
  for (const std::string& out : {in, d.file("sub/../in.jsonl"), d.file("link.jsonl"), d.file("hard.jsonl")}) {
    const std::string msg = error_of([&] { file_check_output(out, {in}, true); });
    EXPECT_NE(msg.find("would overwrite the input " + in), std::string::npos) << out << ": " << msg;
  }
  // A folder output that holds an input (model init --out DIR --hf-config DIR/config.json).
  write_text(d.file("sub/config.json"), "{}");
  const std::string msg =
      error_of([&] { file_check_output(d.file("sub"), {d.file("sub/config.json")}, true); });
  EXPECT_NE(msg.find("it lies inside that folder"), std::string::npos) << msg;
  // Neither an input nor existing: fine; inputs that do not exist are not this check's business.
  EXPECT_EQ(error_of([&] { file_check_output(d.file("new.h5"), {in, d.file("missing")}, false); }), "");
}

TEST(FileCheckOutput, ExistingNonEmptyOutputNeedsForce) {
  ScratchDir d;
  write_text(d.file("old.h5"), "data");
  write_text(d.file("empty.h5"), "");
  fs::create_directories(d.file("full"));
  write_text(d.file("full/x"), "x");
  fs::create_directories(d.file("empty_dir"));
  EXPECT_NE(
      error_of([&] { file_check_output(d.file("old.h5"), {}, false); }).find("already exists (4 bytes)"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] { file_check_output(d.file("full"), {}, false, "--out"); }).find("already holds files"),
      std::string::npos);
  EXPECT_EQ(error_of([&] { file_check_output(d.file("old.h5"), {}, true); }), "");
  EXPECT_EQ(error_of([&] { file_check_output(d.file("full"), {}, true); }), "");
  EXPECT_EQ(error_of([&] { file_check_output(d.file("empty.h5"), {}, false); }), "");
  EXPECT_EQ(error_of([&] { file_check_output(d.file("empty_dir"), {}, false); }), "");
}

TEST(RunLock, SecondHolderIsRefusedNamingTheFirst) {
  ScratchDir d;
  const std::string dir = d.file("run");
  {
    RunLock first(dir);
    first.set_run_id("lineage-1");
    const std::string holder = read_text(dir + "/run.lock");
    EXPECT_NE(holder.find("pid=" + std::to_string(::getpid()) + " "), std::string::npos) << holder;
    EXPECT_NE(holder.find("run_id=lineage-1"), std::string::npos) << holder;
    // flock conflicts between two opens of the file even within one process: the second is refused.
    const std::string msg = error_of([&] { RunLock second(dir); });
    EXPECT_NE(msg.find("is in use by another run (host="), std::string::npos) << msg;
    EXPECT_NE(msg.find("pid=" + std::to_string(::getpid())), std::string::npos) << msg;
  }
  // Released cleanly: the file is empty, the next lock is not stale.
  EXPECT_EQ(read_text(dir + "/run.lock"), "");
  RunLock again(dir);
  EXPECT_EQ(again.stale_holder(), "");
}

TEST(RunLock, DeadHoldersLockIsReportedStale) {
  ScratchDir d;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // now a pid that no process has
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string line =
      std::string("host=") + host + " pid=" + std::to_string(child) + " started=x run_id=old";
  fs::create_directories(d.file("run"));
  write_text(d.file("run/run.lock"), line + "\n");
  RunLock lock(d.file("run"));
  EXPECT_EQ(lock.stale_holder(), line);
  EXPECT_EQ(read_text(d.file("run/run.lock")).find("run_id=old"), std::string::npos);
}

TEST(Lineage, RotationRemovesOnlyTheRunsOwnCheckpoints) {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel m(tiny_drafter_config(), ops);
  drafter_init_params(m, 1);
  const std::string dir = d.file("ck");
  for (int64_t s : {1, 2}) checkpoint_save(dir, m, state_at(s, "run-a"), 2);
  write_text(dir + "/step_00000000.h5", "not hdf5");  // unreadable: nobody's, never deleted
  for (int64_t s : {3, 4, 5}) checkpoint_save(dir, m, state_at(s, "run-b"), 2);
  EXPECT_EQ(entries(dir),
            (std::set<std::string>{"latest", "step_00000000.h5", "step_00000001.h5", "step_00000002.h5",
                                   "step_00000004.h5", "step_00000005.h5"}));
  EXPECT_EQ(checkpoint_read_state(dir + "/step_00000001.h5").run_id, "run-a");
  EXPECT_EQ(checkpoint_read_state(dir + "/step_00000005.h5").run_id, "run-b");
  EXPECT_EQ(checkpoint_load(dir + "/step_00000004.h5", m).run_id, "run-b");
}

TEST(RunStart, EmptyDirStartsFreshWithANewLineage) {
  ScratchDir d;
  RunStart a = run_start_decide(d.file("run"), d.file("run/checkpoints"), "auto", false);
  RunStart b = run_start_decide(d.file("run"), d.file("run/checkpoints"), "none", false);
  EXPECT_EQ(a.resume_path, "");
  EXPECT_EQ(a.state.step, 0);
  EXPECT_FALSE(a.state.run_id.empty());
  EXPECT_NE(a.state.run_id, b.state.run_id);
}

TEST(RunStart, CheckpointsAStartWouldOverwriteAreRefused) {
  RunWithCheckpoints f;
  const std::string &run = f.run, &ck = f.ck;

  // auto with `latest`: resumes it and inherits its lineage.
  RunStart r = run_start_decide(run, ck, "auto", false);
  EXPECT_EQ(r.resume_path, ck + "/step_00000006.h5");
  EXPECT_EQ(r.state.step, 6);
  EXPECT_EQ(r.state.run_id, "run-a");

  std::string msg = error_of([&] { run_start_decide(run, ck, "none", false); });
  EXPECT_NE(msg.find("step_00000004.h5, step_00000006.h5, `latest`. This run starts fresh"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("--fresh-start"), std::string::npos) << msg;
  msg = error_of([&] { run_start_decide(run, ck, ck + "/step_00000004.h5", false); });
  EXPECT_NE(msg.find("step_00000006.h5. This run resumes step 4"), std::string::npos) << msg;
  fs::remove(ck + "/latest");
  msg = error_of([&] { run_start_decide(run, ck, "auto", false); });
  EXPECT_NE(msg.find("there is no `latest` pointer"), std::string::npos) << msg;
  EXPECT_EQ(entries(ck), (std::set<std::string>{"step_00000004.h5", "step_00000006.h5"}));
}

TEST(RunStart, ACheckpointWithoutLineageContinuesUnderANewIdAndIsNeverRotated) {
  ScratchDir d;
  CpuTrainOps ops;
  DrafterModel m(tiny_drafter_config(), ops);
  drafter_init_params(m, 1);
  const std::string run = d.file("run"), ck = run + "/checkpoints";
  checkpoint_save(ck, m, state_at(3, ""), 1);  // as written before run ids existed: no lineage
  RunStart r = run_start_decide(run, ck, "auto", false);
  EXPECT_EQ(r.state.step, 3);
  ASSERT_FALSE(r.state.run_id.empty());
  checkpoint_save(ck, m, state_at(4, r.state.run_id), 1);
  checkpoint_save(ck, m, state_at(5, r.state.run_id), 1);
  EXPECT_EQ(entries(ck), (std::set<std::string>{"latest", "step_00000003.h5", "step_00000005.h5"}));
}

TEST(RunStart, FreshStartMovesTheFolderAsideAndAResumePathFollowsIt) {
  RunWithCheckpoints f;
  const std::string &run = f.run, &ck = f.ck;
  const std::string bytes6 = read_text(ck + "/step_00000006.h5");

  RunStart r = run_start_decide(run, ck, ck + "/step_00000004.h5", true);
  ASSERT_FALSE(r.moved_to.empty());
  EXPECT_EQ(fs::path(r.moved_to).parent_path(), fs::path(run));
  EXPECT_EQ(fs::path(r.moved_to).filename().string().rfind("checkpoints.old-", 0), 0u) << r.moved_to;
  EXPECT_EQ(entries(r.moved_to), (std::set<std::string>{"latest", "step_00000004.h5", "step_00000006.h5"}));
  EXPECT_EQ(read_text(r.moved_to + "/step_00000006.h5"), bytes6);
  EXPECT_FALSE(fs::exists(ck));
  EXPECT_EQ(r.resume_path, r.moved_to + "/step_00000004.h5");
  EXPECT_EQ(r.state.step, 4);
  EXPECT_EQ(r.state.run_id, "run-a");

  // Again, with `auto`: the new folder goes aside too (another name), and the run starts at step 0.
  checkpoint_save(ck, f.m, state_at(2, r.state.run_id), 3);
  RunStart again = run_start_decide(run, ck, "auto", true);
  EXPECT_NE(again.moved_to, r.moved_to);
  EXPECT_EQ(again.resume_path, "");
  EXPECT_NE(again.state.run_id, "run-a");
  EXPECT_TRUE(fs::exists(again.moved_to + "/step_00000002.h5"));
}

TEST(Watchdog, AutomaticBoundFollowsTheSlowestStep) {
  EXPECT_EQ(watchdog_bound_s(30, 100, 1e6), 30);  // configured: fixed
  EXPECT_EQ(watchdog_bound_s(0, 100, 1e6), 0);    // off
  EXPECT_EQ(watchdog_bound_s(-1, 0, 10), kWatchdogStartupS);
  EXPECT_EQ(watchdog_bound_s(-1, 0.5, 10), kWatchdogFloorS);
  EXPECT_EQ(watchdog_bound_s(-1, 10, 10), 200);
  EXPECT_EQ(watchdog_bound_s(-1, 1, 500), 500);  // one checkpoint's write time
  EXPECT_DOUBLE_EQ(watchdog_checkpoint_s(int64_t(50e6)), 12.0);
  Watchdog w(-1, 0, {});
  EXPECT_EQ(w.bound_s(), kWatchdogStartupS);
  w.step_done(10);
  w.step_done(2);
  EXPECT_EQ(w.bound_s(), 200);
}

TEST(WatchdogDeathTest, NamesTheLateRankItWaitsFor) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Watchdog w(0.3, 0, {"target 0", "target 1", "drafter 0"});
        w.beat("waiting for a batch from", 1);
        std::this_thread::sleep_for(std::chrono::seconds(5));
      },
      ::testing::ExitedWithCode(3), "waiting for a batch from target 1 \\(rank 1\\); rank 1 is late");
}
