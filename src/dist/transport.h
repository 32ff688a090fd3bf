// Which transport carries features and gradients (pipeline.transport): NCCL needs one GPU per rank (it refuses
// two ranks on one GPU), so "auto" takes NCCL exactly when the run is on GPUs and no two ranks share one; MPI
// otherwise (CPU runs, and ranks sharing a GPU as on the one-GPU test machine).
#pragma once
#include <string>
#include <vector>

namespace df {

enum class Transport { mpi, nccl };

const char* transport_name(Transport t);

// setting: "auto" | "nccl" | "mpi". hosts[r] and gpus[r] (−1 on CPU) of every world rank; nccl_built: this
// binary has NCCL. Throws naming pipeline.transport when "nccl" is asked and cannot work, saying why.
Transport transport_choose(const std::string& setting, const std::vector<std::string>& hosts,
                           const std::vector<int>& gpus, bool nccl_built, std::string* why);

}  // namespace df
