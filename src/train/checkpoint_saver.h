// Checkpoint saves that do not stall training on a device backend (DESIGN.md "Checkpoint"): the state is
// copied off the device into a host snapshot once per save and a background thread writes the file, `latest`
// and the pruning from it while training goes on. On the CPU backend the state already is host memory and a
// snapshot would double the RAM, so there the save stays synchronous (checkpoint_save).
#pragma once
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "model/drafter.h"
#include "train/checkpoint.h"

namespace df {

class CheckpointSaver {
 public:
  // background: snapshot + writer thread; the default is what the model's backend calls for.
  CheckpointSaver(const DrafterModel& model, bool background);
  explicit CheckpointSaver(const DrafterModel& model);
  // Waits for a write in flight; its error can only be logged here (the training error, if any, is in flight).
  ~CheckpointSaver();
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // checkpoint_save(ckpt_dir, model, state, keep_last). First waits for the previous write (rethrowing its
  // error), so at most one is in flight. In the background the model may change as soon as this returns: the
  // file holds the state as of the call.
  void save(const std::string& ckpt_dir, const CheckpointState& state, int keep_last);
  // Waits for the write in flight, if any; throws df::Error naming its path when it failed.
  void wait();
  bool background() const { return background_; }

 private:
  const DrafterModel& model_;
  const bool background_;
  std::vector<float> snapshot_;  // params, adam_m, adam_v back to back, table.total each; allocated once
  std::thread writer_;
  std::string writing_;          // path of the write in flight
  std::exception_ptr error_;     // set by the writer, read after the join
};

}  // namespace df
