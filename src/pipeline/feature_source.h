// Offline training (`[data] features = [...]`): each drafter reads the taps of its own batches from the feature
// files `dflash_mpi extract` wrote, instead of receiving them from a target rank. It serves the drafter loop
// through the same FeatureReceiver interface, so the training step cannot tell the two apart; a background
// thread reads ahead data.prefetch_depth batches so HDF5 reads overlap training.
#pragma once
#include <memory>

#include "comm/feature_channel.h"
#include "pipeline/train_plan.h"

namespace df {

// The batches drafter `drafter_index` trains from plan.start_step on, in the order the loop asks for them;
// recv()'s target argument is ignored (there are none). plan must outlive the receiver.
std::unique_ptr<FeatureReceiver> feature_receiver_files(const TrainPlan& plan, int drafter_index);

}  // namespace df
