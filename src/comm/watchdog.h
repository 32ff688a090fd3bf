// Hang guard: a thread that ends the process when the rank's loop has not reported progress for too long
// (a peer that hangs without dying — stopped, deadlocked, stuck in a driver — would otherwise hold the whole
// job forever). The launcher sees the non-zero exit and takes the other ranks down. Its messages name the
// rank waited on, so the log says which rank is late, and what this rank was doing.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace df {

struct DistContext;

// The automatic bound (run.watchdog_s unset): before any step is measured, a start-up allowance (peers load
// target weights and make their first batch); then max(120 s, 20 × the slowest step so far, the time one
// checkpoint takes at a pessimistic 50 MB/s) — the last so that the ranks waiting for drafter 0's first
// checkpoint do not fire before a checkpoint step has been measured.
constexpr double kWatchdogStartupS = 1800, kWatchdogFloorS = 120, kWatchdogStepFactor = 20;
// configured_s > 0: that, fixed; 0: off (returns 0); < 0: automatic as above. slowest_step_s <= 0: none yet.
double watchdog_bound_s(double configured_s, double slowest_step_s, double checkpoint_s);
// Seconds to write one checkpoint of `drafter_params` parameters (weights and two Adam moments, f32) at 50
// MB/s.
double watchdog_checkpoint_s(int64_t drafter_params);
// "target 0", "drafter 1", ... by world rank: how messages name the peer waited on.
std::vector<std::string> watchdog_rank_names(const DistContext& ctx);

class Watchdog {
 public:
  // configured_s: run.watchdog_s (see watchdog_bound_s). rank_names: watchdog_rank_names, or empty.
  Watchdog(double configured_s, double checkpoint_s, std::vector<std::string> rank_names);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Progress: `what` (a static string) is what the rank is about to do or wait for; `peer` the world rank it
  // waits on (-1: none), named in the messages as "<what> <peer name> (rank N)". `patience` scales the bound
  // for this wait: a rank that waits on a rank that itself waits (a target waiting for a drafter's credit)
  // uses more, so the rank next to the hung one fires first and names it.
  void beat(const char* what, int peer = -1, double patience = 1.0);
  // One step (drafters) or batch (targets) took `seconds`: feeds the automatic bound.
  void step_done(double seconds);
  double bound_s() const;

 private:
  void run();
  std::string describe() const;

  const double configured_s_, checkpoint_s_;
  const std::vector<std::string> rank_names_;
  std::atomic<int64_t> last_ns_{0};
  std::atomic<const char*> what_{"starting up"};
  std::atomic<int> peer_{-1};
  std::atomic<double> patience_{1.0}, slowest_s_{0.0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace df
