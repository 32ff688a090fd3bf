// The hang guard; see watchdog.h. It exits with _Exit rather than MPI_Abort: MPI is initialised
// funneled (only the main thread may call it), and the main thread is the one that is stuck.
#include "comm/watchdog.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/log.h"
#include "core/strfmt.h"
#include "comm/dist.h"

namespace df {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

double watchdog_bound_s(double configured_s, double slowest_step_s, double checkpoint_s) {
  if (configured_s >= 0) return configured_s;
  if (slowest_step_s <= 0) return std::max(kWatchdogStartupS, checkpoint_s);
  return std::max({kWatchdogFloorS, kWatchdogStepFactor * slowest_step_s, checkpoint_s});
}

double watchdog_checkpoint_s(int64_t drafter_params) {
  return 12.0 * double(drafter_params) / 50e6;
}

std::vector<std::string> watchdog_rank_names(const DistContext& ctx) {
  std::vector<std::string> names(size_t(ctx.world));
  for (size_t i = 0; i < ctx.roles.targets.size(); ++i)
    names[size_t(ctx.roles.targets[i])] = strfmt("target %zu", i);
  for (size_t i = 0; i < ctx.roles.drafters.size(); ++i)
    names[size_t(ctx.roles.drafters[i])] = strfmt("drafter %zu", i);
  return names;
}

Watchdog::Watchdog(double configured_s, double checkpoint_s, std::vector<std::string> rank_names)
    : configured_s_(configured_s), checkpoint_s_(checkpoint_s), rank_names_(std::move(rank_names)) {
  last_ns_ = now_ns();
  if (configured_s_ != 0) thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::beat(const char* what, int peer, double patience) {
  what_ = what;
  peer_ = peer;
  patience_ = patience;
  last_ns_ = now_ns();
}

void Watchdog::step_done(double seconds) {
  if (seconds > slowest_s_.load()) slowest_s_ = seconds;
}

double Watchdog::bound_s() const {
  return watchdog_bound_s(configured_s_, slowest_s_.load(), checkpoint_s_);
}

std::string Watchdog::describe() const {
  const int peer = peer_.load();
  if (peer < 0) return what_.load();
  const std::string name = size_t(peer) < rank_names_.size() ? rank_names_[size_t(peer)] : "a peer";
  return strfmt("%s %s (rank %d)", what_.load(), name.c_str(), peer);
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  int64_t warned_for = -1;  // the beat (by its time stamp) already reported as late
  while (!cv_.wait_for(lock, std::chrono::milliseconds(250), [this] { return stop_; })) {
    const int64_t last = last_ns_.load();
    const double idle = double(now_ns() - last) * 1e-9;
    const double bound = bound_s() * patience_.load();
    const double slowest = slowest_s_.load();
    const std::string how = configured_s_ > 0 ? strfmt("run.watchdog_s = %.0f", configured_s_)
                            : slowest > 0
                                ? strfmt(
                                      "automatic: max(%.0f s, %.0f x the slowest step %.2f s, "
                                      "one checkpoint %.0f s)",
                                      kWatchdogFloorS, kWatchdogStepFactor, slowest, checkpoint_s_)
                                : std::string("automatic: start-up allowance, no step measured yet");
    const ProcessInfo& p = process_info();
    const int peer = peer_.load();
    if (idle > bound) {
      std::fprintf(
          stderr,
          "[rank %d %s] FATAL: watchdog: no progress for %.0f s (bound %.0f s, %s) while %s; %s. HINT: "
          "check that rank's log and host (its own watchdog line says what it was doing); set "
          "run.watchdog_s if steps are legitimately this slow\n",
          p.rank, p.host.c_str(), idle, bound, how.c_str(), describe().c_str(),
          peer >= 0 ? strfmt("rank %d is late: stopped, hung or dead", peer).c_str()
                    : "a peer rank is probably hung or dead");
      std::fflush(stderr);
      std::_Exit(3);
    }
    // Half-way: a heartbeat line, so a rank that is itself stuck says what it was doing before anyone fires.
    if (idle > 0.5 * bound && warned_for != last) {
      warned_for = last;
      std::fprintf(stderr,
                   "[rank %d %s] watchdog: no progress for %.0f s (ends the job at %.0f s) while %s\n",
                   p.rank, p.host.c_str(), idle, bound, describe().c_str());
      std::fflush(stderr);
    }
  }
}

}  // namespace df
