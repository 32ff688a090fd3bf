// Warm start from a Hugging Face DFlash drafter (`drafter.init_from = DIR`): the folder `dflash_mpi export`
// writes or a published one (z-lab), config.json + model.safetensors. The folder must describe the run's
// drafter exactly (a mismatch is an error naming the field); the weights are loaded and the optimizer starts
// fresh.
#pragma once
#include <string>

#include "model/drafter.h"

namespace df {

// Throws naming the first config.json field (and the run config key) where the folder's drafter `hf` differs
// from the run's `run`; `where` names the folder.
void drafter_config_check_same(const DrafterConfig& run, const DrafterConfig& hf, const std::string& where);

// Copies DIR's model.safetensors (F32, BF16 or F16) into m.params. Every tensor of the parameter table must
// be there with its shape (norm vectors [n] or [1, n]), under its name or, as early SpecForge Domino/DSpark
// checkpoints saved their heads, under `logit_head.` + its name; a tensor that is not a drafter parameter is
// an error too (a wrong folder, e.g. a target checkpoint).
void drafter_load_hf_weights(DrafterModel& m, const std::string& dir);

// drafter.init_from: checks DIR/config.json against m's config, loads the weights, zeroes grads and Adam m,
// v. A DFlash folder may start a DFlash2 drafter of the same backbone: its convolutions start at the identity
// (base kernels [1, 0, ...], kernel projections 0) and its successor codebook at 0, so it computes the DFlash
// drafter's logits and proposes their argmax; the predecessor codebook and hidden projection keep m's values
// (drafter_init_params').
void drafter_init_from(DrafterModel& m, const std::string& dir);

}  // namespace df
