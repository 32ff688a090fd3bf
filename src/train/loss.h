// The drafter loss a run config's [train] section asks for: the train.loss spelling and the options the
// drafter's forward/backward takes (model/drafter.h DrafterLossOptions). The row weights and statistics
// themselves are ops/loss_rows.h. The loss is normalised by the caller over the whole optimizer step:
// loss = Σ w·L / Σ w.
#pragma once
#include <string>

#include "core/config.h"
#include "model/drafter.h"

namespace df {

// The train.loss spelling → its DpaceKind (off for ce / kl); throws on anything else.
DpaceKind loss_dpace_kind(const std::string& loss);

// The options a run config's [train] section sets (loss kind, γ, streak, D-PACE, DSpark's term weights);
// noise, backward and fixed weights are the caller's.
DrafterLossOptions loss_options_from_config(const TrainSection& t);

// DrafterLossOptions::domino_lambda at optimizer step `step` (0-based) of total_steps for a drafter of
// config c: SpecForge's linear_lambda_base with train.lambda_base_start and train.lambda_base_decay_ratio
// (ops/domino_head.h domino_lambda_base); 0 for any kind but domino.
double loss_domino_lambda(const TrainSection& t, const DrafterConfig& c, int64_t step, int64_t total_steps);
// DrafterLossOptions::dflash2_selector_alpha at optimizer step `step` (0-based, the steps completed) of
// total_steps for a drafter of config c: train.dflash2_selector_loss_alpha on SpecForge's warm-up and ramp
// (ops/dflash2_selector.h dflash2_selector_alpha); 0 for any kind but dflash2.
double loss_dflash2_selector_alpha(const TrainSection& t, const DrafterConfig& c, int64_t step,
                                   int64_t total_steps);

}  // namespace df
