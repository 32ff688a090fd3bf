// The hang guard; see watchdog.h. It exits with _Exit rather than MPI_Abort: MPI is initialised
// funneled (only the main thread may call it), and the main thread is the one that is stuck.
#include "dist/watchdog.h"

#include <cstdio>
#include <cstdlib>

#include "core/log.h"

namespace df {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Watchdog::Watchdog(double timeout_s) : timeout_s_(timeout_s) {
  last_ns_ = now_ns();
  if (timeout_s_ > 0) thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::beat(const char* what) {
  what_ = what;
  last_ns_ = now_ns();
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stop_; })) {
    const double idle = double(now_ns() - last_ns_.load()) * 1e-9;
    if (idle > timeout_s_) {
      const ProcessInfo& p = process_info();
      std::fprintf(stderr,
                   "[rank %d %s] FATAL: watchdog: no progress for %.0f s while %s; a peer rank is probably hung or "
                   "dead. HINT: check that rank's log; raise run.watchdog_s if steps are legitimately this slow\n",
                   p.rank, p.host.c_str(), idle, what_.load());
      std::fflush(stderr);
      std::_Exit(3);
    }
  }
}

}  // namespace df
