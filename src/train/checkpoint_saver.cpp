// The background checkpoint writer (checkpoint_saver.h): one host snapshot reused by every save, one write in
// flight, and every failure handed back to the training thread at its next wait.
#include "train/checkpoint_saver.h"

#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "train/checkpoint_io.h"

namespace df {

namespace {

// The tensors from the snapshot: the same chunked writer as a save off the backend, reading host memory.
class SnapshotSource : public CheckpointSource {
 public:
  SnapshotSource(const float* snapshot, int64_t total) : snapshot_(snapshot), total_(total) {}
  void read(int g, const DrafterParamEntry& e, int64_t r0, int64_t n, float* dst) const override {
    std::memcpy(dst, snapshot_ + g * total_ + e.offset + r0 * e.cols, size_t(n * e.cols) * sizeof(float));
  }

 private:
  const float* snapshot_;
  int64_t total_;
};

}  // namespace

CheckpointSaver::CheckpointSaver(const DrafterModel& model, bool background)
    : model_(model), background_(background) {}

CheckpointSaver::CheckpointSaver(const DrafterModel& model)
    : CheckpointSaver(model, model.ops().device() != Device::cpu) {}

CheckpointSaver::~CheckpointSaver() {
  if (!writer_.joinable()) return;
  writer_.join();
  if (!error_) return;
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    log_warn("checkpoint: the background save of %s failed: %s", writing_.c_str(), e.what());
  }
}

void CheckpointSaver::wait() {
  if (!writer_.joinable()) return;
  writer_.join();
  if (!error_) return;
  std::exception_ptr err = error_;
  error_ = nullptr;
  try {
    std::rethrow_exception(err);
  } catch (const std::exception& e) {
    DF_FAIL("the background checkpoint save of %s failed: %s", writing_.c_str(), e.what());
  }
}

void CheckpointSaver::save(const std::string& ckpt_dir, const CheckpointState& state, int keep_last) {
  wait();
  if (!background_) {
    checkpoint_save(ckpt_dir, model_, state, keep_last);
    return;
  }
  const int64_t total = model_.table().total;
  if (snapshot_.empty()) snapshot_.resize(size_t(3 * total));
  const Tensor* flat[3] = {&model_.params, &model_.adam_m, &model_.adam_v};
  for (int g = 0; g < 3; ++g) model_.ops().download_raw(*flat[g], snapshot_.data() + g * total);
  writing_ = checkpoint_path_for_step(ckpt_dir, state.step);
  writer_ = std::thread([this, ckpt_dir, state, keep_last, total] {
    try {
      checkpoint_save_from(ckpt_dir, model_.config(), model_.table(), SnapshotSource(snapshot_.data(), total),
                           state, keep_last);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

}  // namespace df
