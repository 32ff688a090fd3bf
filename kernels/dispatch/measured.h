// Kernel choices made by measurement, beside the rule-based ones of dispatch.h: where two implementations of
// one op each win on some devices and shapes (this project's prefill attention and cuDNN's), the first call
// of a shape class times both on the running device, on the call's own operands, and the faster serves that
// class for the rest of the process. Each decision is logged once, with both times.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

namespace df {

// The calling thread's current device: the key of the per-device state measured choices and plans keep.
int cuda_current_device();

// One candidate: its name in the log and a call that runs the op on the real operands (each candidate writes
// the same result, so whichever ran last leaves a valid output).
struct MeasuredForm {
  std::string name;
  std::function<void()> run;
};

// The index of the form kept for shape class `key` on the current device, or -1 before the class is measured.
int measured_pick(const std::string& key);

// Measures `forms` for `key` on the current device: each runs once untimed (which loads its kernels or builds
// its plan), then kMeasuredReps times between two events on `stream`; the fastest is kept for the class and
// returned, form 0 unless another is at least 1 % faster (less is timing noise). A form that throws is left
// out and its error quoted in the log line; when every form throws, the first form's error is rethrown.
// Synchronises `stream`, so never call it on a stream being captured.
int measured_choose(const std::string& key, const std::vector<MeasuredForm>& forms, cudaStream_t stream);

// One line to where measured decisions go (below): also the plans a measured candidate builds.
void dispatch_log(const std::string& line);

// Where measured decisions are logged, one line each: the CUDA backend passes its rank-0 log_info (the
// kernels library cannot call into src/); until set, stdout.
void dispatch_log_set(void (*sink)(const std::string& line));

}  // namespace df
