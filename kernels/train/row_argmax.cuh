// The greedy pick of a drafter head's proposal (domino_head.cu, dspark_head.cu): the argmax of one f32 logits
// row on the device, so a proposal loop feeds the next slot without the host reading anything back.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace df {

// out[0] = argmax of row [V] f32 (ties → lowest index), one CTA in a fixed order; launch checked.
void row_argmax_launch(const float* row, int64_t V, int32_t* out, cudaStream_t stream);

}  // namespace df
