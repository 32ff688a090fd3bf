// DrafterMemory: the drafter backend's memory planned once for a run (the frozen embedding/lm_head and the
// staging of each batch's bf16 features in the backend's act dtype). Shared by the training loop and the
// held-out evaluation (pipeline/heldout.h), which stage their batches the same way.
#pragma once
#include <vector>

#include "comm/feature_channel.h"
#include "model/drafter.h"
#include "ops/train_ops.h"

namespace df {

// The CPU backend trains in f32 on host memory, so it uses the host tables as they are and converts each
// batch's bf16 features to f32; a bf16 backend gets the tables uploaded once as bf16 and each batch's bf16
// bytes in one copy, no conversion.
class DrafterMemory {
 public:
  // embed/lm_head: host tables of the loaded target. max_tokens: the most tokens of one host-built batch
  // (data.token_budget; 0 when every batch comes off the channel, which needs no staging); feat_cols: the taps' columns; final_cols: the final-norm columns (0 = none, no KL).
  DrafterMemory(TrainOps& ops, const Tensor& embed, const Tensor& lm_head, int64_t max_tokens,
                int64_t feat_cols, int64_t final_cols);
  ~DrafterMemory();
  DrafterMemory(const DrafterMemory&) = delete;
  DrafterMemory& operator=(const DrafterMemory&) = delete;

  const Tensor& embed() const { return embed_; }
  const Tensor& lm_head() const { return lm_head_; }

  // The packet as a drafter batch. A packet off the channel is used where it landed (a device drafter
  // trains from its receive slot in place; the CPU one converts to f32); a host-built packet (offline files,
  // held-out data) is copied into the staging memory. Valid until the next load or recv.
  DrafterBatch load(const FeaturePacket& p);

 private:
  Tensor upload_bf16(const Tensor& t, char* at);
  // The CPU backend's f32 copy of rows x cols bf16 values, in f32 (kept for the next batch).
  Tensor host_f32(const uint16_t* bf16, int64_t rows, int64_t cols, std::vector<float>& f32);
  Tensor in_slot(const char* at, Device where, int64_t rows, int64_t cols, std::vector<float>& f32);
  Tensor stage(const std::vector<uint16_t>& bf16, int64_t cols, const Tensor& dev, std::vector<float>& f32);

  TrainOps& ops_;
  bool host_;
  char* mem_ = nullptr;
  Tensor embed_, lm_head_, taps_, final_;
  std::vector<float> taps_f32_, final_f32_;
};

}  // namespace df
