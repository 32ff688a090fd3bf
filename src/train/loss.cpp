// A run config's [train] loss settings → the drafter's loss options.
#include "train/loss.h"

#include "core/error.h"

namespace df {

DrafterLossOptions loss_options_from_config(const TrainSection& t) {
  DrafterLossOptions o;
  o.kind = t.loss == "kl" ? LmLossKind::kl : LmLossKind::ce;
  o.gamma = float(t.gamma);
  o.streak = t.streak;
  o.streak_alpha = float(t.streak_alpha);
  o.dpace = loss_dpace_kind(t.loss);
  o.dpace_alpha = float(t.dpace_alpha);
  o.dflash2_stop_gradient = t.dflash2_selector_stop_gradient;
  o.dspark = dspark_loss_alphas(t);
  return o;
}

double loss_dflash2_selector_alpha(const TrainSection& t, const DrafterConfig& c, int64_t step,
                                   int64_t total_steps) {
  if (c.kind != DrafterKind::dflash2) return 0.0;
  return dflash2_selector_alpha(step, total_steps, t.dflash2_selector_loss_alpha,
                                t.dflash2_selector_warmup_ratio, t.dflash2_selector_ramp_ratio);
}

double loss_domino_lambda(const TrainSection& t, const DrafterConfig& c, int64_t step, int64_t total_steps) {
  if (c.kind != DrafterKind::domino) return 0.0;
  return domino_lambda_base(step, total_steps, t.lambda_base_start, t.lambda_base_decay_ratio);
}

DpaceKind loss_dpace_kind(const std::string& loss) {
  if (loss == "ce" || loss == "kl") return DpaceKind::off;
  if (loss == "dpace") return DpaceKind::full;
  if (loss == "dpace-cumulative-confidence-only") return DpaceKind::cumulative_confidence_only;
  if (loss == "dpace-continuation-value-only") return DpaceKind::continuation_value_only;
  DF_FAIL(
      "train.loss = \"%s\" is not a loss; HINT: ce, kl, dpace, dpace-cumulative-confidence-only or "
      "dpace-continuation-value-only",
      loss.c_str());
}

}  // namespace df
