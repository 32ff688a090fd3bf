// The drafter's optimizer step and schedules: AdamW over the flat fp32 buffers with global-norm clipping,
// LR warmup then cosine to 0, and the cosine decay of the context-feature noise.
#pragma once
#include <cstdint>

#include "model/drafter.h"

namespace df {

struct OptimConfig {
  float lr = 6e-4f;  // peak
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled, matrices only (norm weights are never decayed)
  float clip = 1.0f;          // global grad-norm limit; ≤ 0 disables clipping
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
};

// LR of optimizer step `step` (0-based): lr·(step+1)/warmup during warmup, then
// lr·½(1 + cos(π·(step − warmup)/(total − warmup))), reaching 0 at step == total (and staying 0 after).
float lr_at(const OptimConfig& o, int64_t step);

// Feature-noise std at `step`: std0·½(1 + cos(π·min(step / decay_steps, 1))); 0 from decay_steps on.
float noise_std_at(float std0, int64_t step, int64_t decay_steps);

struct AdamwStepResult {
  double grad_norm = 0;  // global L2 norm of grad_scale · grads, before clipping
  float clip_scale = 1;  // factor applied on top of grad_scale (1 when not clipped)
  float lr = 0;
};

// One AdamW update of step `step` (0-based; bias correction uses step+1) on m.params with gradient
// grad_scale · m.grads (grad_scale = 1 / Σw of the whole optimizer step), clipped to o.clip. Refuses stale
// gradients (drafter_begin_step with no backward since, and no drafter_grads_ready). Grads are left as they
// are (the next step's drafter_begin_step marks them stale).
AdamwStepResult adamw_step(DrafterModel& m, const OptimConfig& o, int64_t step, double grad_scale);

}  // namespace df
