// Hang guard: a thread that ends the process when the rank's loop has not reported progress for too long
// (a peer that hangs without dying — stopped, deadlocked, stuck in a driver — would otherwise hold the whole
// job forever). The launcher sees the non-zero exit and takes the other ranks down.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace df {

class Watchdog {
 public:
  // timeout_s <= 0 disables it.
  explicit Watchdog(double timeout_s);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Progress: `what` names what the rank is about to wait for (shown if it never comes). Static strings only.
  void beat(const char* what);

 private:
  void run();

  double timeout_s_;
  std::atomic<int64_t> last_ns_{0};
  std::atomic<const char*> what_{"start-up"};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace df
