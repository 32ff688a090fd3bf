// The measured choices of kernels/dispatch/measured.h: a table of decisions per device and shape class, the
// timing loop that fills it, and the log line each decision gets.
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/dispatch/measured.h"
#include "kernels/primitives/cuda_check.cuh"

namespace df {

namespace {

// Timed calls per form after the untimed one: enough to average out launch jitter on the millisecond-long
// prefill attention calls, few enough that measuring a class costs a handful of calls.
constexpr int kMeasuredReps = 3;
// Another form replaces form 0 only when it is at least this much faster.
constexpr float kMeasuredSwitchRatio = 0.99f;

struct MeasuredStore {
  std::mutex mu;
  std::map<std::pair<int, std::string>, int> picks;  // (device, class) -> form index
  void (*sink)(const std::string&) = nullptr;
};

MeasuredStore& store() {
  static MeasuredStore s;
  return s;
}

// The per-call milliseconds of `run`: one untimed call, then kMeasuredReps between two events.
float time_form(const std::function<void()>& run, cudaStream_t stream, cudaEvent_t ev0, cudaEvent_t ev1) {
  run();
  DF_CUDA_CHECK(cudaEventRecord(ev0, stream));
  for (int r = 0; r < kMeasuredReps; ++r) run();
  DF_CUDA_CHECK(cudaEventRecord(ev1, stream));
  DF_CUDA_CHECK(cudaEventSynchronize(ev1));
  float ms = 0.0f;
  DF_CUDA_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
  return ms / kMeasuredReps;
}

}  // namespace

void dispatch_log(const std::string& line) {
  void (*sink)(const std::string&) = nullptr;
  {
    std::lock_guard<std::mutex> lock(store().mu);
    sink = store().sink;
  }
  if (sink) {
    sink(line);
  } else {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

int cuda_current_device() {
  int dev = 0;
  DF_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

int measured_pick(const std::string& key) {
  const int dev = cuda_current_device();
  std::lock_guard<std::mutex> lock(store().mu);
  auto it = store().picks.find({dev, key});
  return it == store().picks.end() ? -1 : it->second;
}

int measured_choose(const std::string& key, const std::vector<MeasuredForm>& forms, cudaStream_t stream) {
  const int dev = cuda_current_device();
  cudaEvent_t ev[2];
  DF_CUDA_CHECK(cudaEventCreate(&ev[0]));
  DF_CUDA_CHECK(cudaEventCreate(&ev[1]));
  std::vector<float> ms(forms.size(), -1.0f);
  std::vector<std::string> errors(forms.size());
  for (size_t i = 0; i < forms.size(); ++i) {
    try {
      ms[i] = time_form(forms[i].run, stream, ev[0], ev[1]);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  }
  cudaEventDestroy(ev[0]);
  cudaEventDestroy(ev[1]);
  int best = -1;
  for (size_t i = 0; i < forms.size(); ++i)
    if (ms[i] >= 0.0f && (best < 0 || ms[i] < ms[size_t(best)])) best = int(i);
  if (best < 0) kernel_throw(__FILE__, __LINE__, errors[0]);
  if (best != 0 && ms[0] >= 0.0f && ms[size_t(best)] > kMeasuredSwitchRatio * ms[0]) best = 0;
  {
    std::lock_guard<std::mutex> lock(store().mu);
    store().picks[{dev, key}] = best;
  }
  std::string line = "dispatch: " + key + " on device " + std::to_string(dev) + ":";
  for (size_t i = 0; i < forms.size(); ++i) {
    char t[64];
    std::snprintf(t, sizeof t, " %.3f ms", double(ms[i]));
    line +=
        (i ? ", " : " ") + forms[i].name + (ms[i] >= 0.0f ? std::string(t) : " refused (" + errors[i] + ")");
  }
  dispatch_log(line + " -> " + forms[size_t(best)].name);
  return best;
}

void dispatch_log_set(void (*sink)(const std::string& line)) {
  std::lock_guard<std::mutex> lock(store().mu);
  store().sink = sink;
}

}  // namespace df
