// Picks the backend for a device (target inference ops and drafter training ops): the CPU reference or, when
// built with CUDA, the GPU backend.
#pragma once
#include <memory>
#include <string>

#include "ops/ops.h"
#include "ops/train_ops.h"

namespace df {

// device: "cpu" or "cuda"; gpu: the CUDA device index (ignored on CPU). Throws naming the device when this
// build or machine cannot provide it.
std::unique_ptr<Ops> ops_create(const std::string& device, int gpu);
// The drafter's training ops on `device` ("cpu" or "cuda", the config's drafter.device); gpu as above.
std::unique_ptr<TrainOps> train_ops_create(const std::string& device, int gpu);

}  // namespace df
