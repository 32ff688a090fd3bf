// How an RMSNorm applies its weight. The model config decides it (model/qwen_config.h norm_kind) and every
// norm op takes it (ops/ops.h), so it lives below both.
#pragma once
#include <cstdint>

namespace df {

enum class NormKind : uint8_t {
  plain,         // Qwen3: w · (x · rsqrt(mean(x²) + eps))
  zero_centred,  // Qwen3.5/3.6: (1 + w) · (x · rsqrt(mean(x²) + eps))
};

}  // namespace df
