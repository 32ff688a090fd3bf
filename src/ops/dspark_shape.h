// DSpark's head as the CUDA launchers see it (kernels/train/dspark_workspace.h DSparkHeadShape): for the CUDA
// backend's calls and the VRAM planner's count of their workspace, both from ops/dspark_head.h's dims.
#pragma once
#include <cstdint>

#include "kernels/train/dspark_workspace.h"
#include "ops/dspark_head.h"

namespace df {

// nb blocks of this head: the Markov head's type as DSparkMarkov, the confidence input with W1[prev] only
// where there is a confidence head. Throws on dims no head has.
DSparkHeadShape dspark_head_shape(const DSparkHeadDims& d, int64_t nb);

}  // namespace df
