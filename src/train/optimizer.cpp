// AdamW step and schedules. The norm is computed on the device buffer (one reduction) and the clip factor is
// folded into the gradient scale so the update stays one pass over the flat buffers (the bf16 weight shadow,
// where the backend keeps one, is rewritten in the same pass).
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace df {

float lr_at(const OptimConfig& o, int64_t step) {
  DF_CHECK(o.total_steps > 0 && o.warmup_steps >= 0 && o.warmup_steps <= o.total_steps,
           "optimizer: need 0 ≤ warmup_steps (%lld) ≤ total_steps (%lld), total > 0", (long long)o.warmup_steps,
           (long long)o.total_steps);
  if (step < o.warmup_steps) return o.lr * float(step + 1) / float(o.warmup_steps);
  if (step >= o.total_steps) return 0.0f;
  const double frac = double(step - o.warmup_steps) / double(o.total_steps - o.warmup_steps);
  return float(o.lr * 0.5 * (1.0 + std::cos(M_PI * frac)));
}

float noise_std_at(float std0, int64_t step, int64_t decay_steps) {
  if (decay_steps <= 0 || step >= decay_steps) return 0.0f;
  return float(std0 * 0.5 * (1.0 + std::cos(M_PI * double(step) / double(decay_steps))));
}

AdamwStepResult adamw_step(DrafterModel& m, const OptimConfig& o, int64_t step, double grad_scale) {
  DF_CHECK(std::isfinite(grad_scale) && grad_scale > 0, "adamw_step: grad_scale %g must be finite and > 0 (Σw = 0?)",
           grad_scale);
  DF_CHECK(!m.grads_stale,
           "adamw_step: step %lld: the gradients are still the previous step's (drafter_begin_step, then no "
           "backward); HINT: call drafter_grads_ready(model) after the micro-batches, before the all-reduce",
           (long long)step);
  TrainOps& ops = m.ops();
  AdamwStepResult r;
  r.grad_norm = std::sqrt(ops.sum_squares(m.grads)) * grad_scale;
  DF_CHECK(std::isfinite(r.grad_norm), "adamw_step: gradient norm is %g at step %lld; the loss diverged",
           r.grad_norm, (long long)step);
  if (o.clip > 0) r.clip_scale = float(std::min(1.0, double(o.clip) / (r.grad_norm + 1e-6)));
  r.lr = lr_at(o, step);
  TrainOps::AdamW hp;
  hp.lr = r.lr;
  hp.beta1 = o.beta1;
  hp.beta2 = o.beta2;
  hp.eps = o.eps;
  hp.weight_decay = o.weight_decay;
  hp.grad_scale = float(grad_scale * r.clip_scale);
  hp.step_t = step + 1;
  hp.n_decay = m.table().n_decay;
  ops.adamw(m.params, m.grads, m.adam_m, m.adam_v, m.params_lp, hp);
  return r;
}

}  // namespace df
