// The drafter's feature inbox and gradient reducer for its transport and backend (comm/drafter_links.h): the
// one place that tells a CUDA drafter from a CPU one and NCCL from MPI.
#include "comm/drafter_links.h"

#include "core/error.h"
#ifdef DF_HAVE_CUDA
#include "ops/cuda/cuda_train_ops.h"
#endif

namespace df {

FeatureInbox feature_inbox_create(const DistContext& ctx, TrainOps& ops, int depth, size_t slot_bytes,
                                  DrafterBatches order) {
  NcclComm* nccl = ctx.nccl_world.get();
  FeatureInbox in;
  in.pool = ops.wire_pool(depth, slot_bytes, nccl == nullptr);
  in.rx = feature_receiver(ctx.data_comm, ctx.roles.targets, order, *in.pool,
                           payload_wire(ctx.data_comm, nccl, *in.pool));
  return in;
}

std::unique_ptr<GradReducer> grad_reducer_create(const DistContext& ctx, TrainOps& ops, size_t grads) {
  if (ops.device() == Device::cpu) return grad_reducer_mpi(ctx.drafter_comm);
#ifdef DF_HAVE_CUDA
  auto* cuda = dynamic_cast<CudaTrainOps*>(&ops);
  DF_CHECK(cuda != nullptr, "drafter on %s: no gradient reducer for this backend", ops.name());
  if (ctx.nccl_drafters) return grad_reducer_nccl(*ctx.nccl_drafters, cuda->stream(), ctx.drafter_comm);
  return grad_reducer_staged(ctx.drafter_comm, cuda->stream(), grads);
#else
  DF_FAIL("drafter on %s in a build without CUDA", ops.name());
#endif
}

}  // namespace df
