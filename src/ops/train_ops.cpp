// TrainOps' DFlash2 ops on a backend that has none (train_ops.h "DFlash2"; a wrapper such as a test's op
// counter): a clear refusal naming the backend. drafter_check_kind_trainable refuses a DFlash2 drafter on
// such a backend before any op runs.
#include "ops/train_ops.h"

#include "core/error.h"

namespace df {

namespace {

[[noreturn]] void refuse(const TrainOps& ops, const char* op) {
  DF_FAIL(
      "%s: the %s backend has no DFlash2 ops (the CPU and CUDA backends have them); HINT: "
      "drafter.device = \"cpu\" or \"cuda\", or drafter.kind = \"dflash\"",
      op, ops.name());
}

}  // namespace

void TrainOps::dflash2_conv_fwd(const Tensor&, const Tensor&, const Tensor&, int, const Tensor&,
                                const Tensor&, const Dflash2ConvDims&) {
  refuse(*this, "dflash2_conv_fwd");
}

void TrainOps::dflash2_conv_bwd(const Tensor&, const Tensor&, const Tensor&, int, const Tensor&,
                                const Tensor&, const Tensor&, const Tensor&, float, const Dflash2ConvDims&) {
  refuse(*this, "dflash2_conv_bwd");
}

void TrainOps::dflash2_selector_loss(const Tensor&, const Tensor&, const Dflash2SelectorWeights&,
                                     const Tensor&, const Tensor&, const Tensor&, const Dflash2SelectorArgs&,
                                     const Tensor&, const Tensor&, const Dflash2SelectorWeights&,
                                     const Tensor&) {
  refuse(*this, "dflash2_selector_loss");
}

std::vector<int32_t> TrainOps::dflash2_selector_propose(const Tensor&, const Tensor&,
                                                        const Dflash2SelectorWeights&,
                                                        const Dflash2SelectorDims&, int32_t) {
  refuse(*this, "dflash2_selector_propose");
}

}  // namespace df
