// What a drafter rank talks through, chosen in one place from the run's transport (DistContext) and the
// drafter's backend: its end of the feature channel and its gradient reducer. The training loop asks for them
// and never names a transport or a backend.
#pragma once
#include <cstddef>
#include <memory>

#include "comm/dist.h"
#include "comm/feature_channel.h"
#include "comm/grad_reducer.h"
#include "ops/train_ops.h"

namespace df {

// The drafter's end of the feature channel: its receive slots and the receiver that fills them.
struct FeatureInbox {
  std::unique_ptr<WirePool> pool;
  std::unique_ptr<FeatureReceiver> rx;  // reads pool: declared after it, so destroyed first
};

// `depth` slots of `slot_bytes` in the backend's memory, received from ctx.roles.targets over ctx.data_comm
// in `order`. Transport nccl: the payload lands in the device slot itself (no host mirrors); else over MPI
// through the slots' host bytes.
FeatureInbox feature_inbox_create(const DistContext& ctx, TrainOps& ops, int depth, size_t slot_bytes,
                                  DrafterBatches order);

// The gradient all-reduce among the drafters for a backend's gradients (`grads` floats): a CPU drafter sums
// its host gradients over MPI; a CUDA drafter its device gradients, by NCCL when the transport is NCCL, else
// over MPI through a pinned host buffer.
std::unique_ptr<GradReducer> grad_reducer_create(const DistContext& ctx, TrainOps& ops, size_t grads);

}  // namespace df
