// Which transport carries features and gradients (pipeline.transport): NCCL needs one GPU per rank as far as it
// can tell (it refuses two ranks of one host on one GPU), so "auto" takes NCCL exactly when the run is on GPUs
// and no two ranks share one; MPI otherwise (CPU runs, and ranks sharing a GPU as on the one-GPU test machine).
// NCCL takes its host identity from NCCL_HOSTID: ranks that share a GPU but each carry their own id form a
// real communicator that talks over the network transport (sockets on loopback). That is the shared-GPU test
// mode, taken only when asked for (transport "nccl"): it runs every NCCL path on one GPU, at socket speed.
#pragma once
#include <string>
#include <vector>

namespace df {

enum class Transport { mpi, nccl };

const char* transport_name(Transport t);

// Every world rank's placement, as the transport choice sees it.
struct TransportRanks {
  std::vector<std::string> hosts;     // the host each rank runs on
  std::vector<int> gpus;              // its GPU (-1 on CPU)
  std::vector<std::string> host_ids;  // its NCCL_HOSTID ("" when unset)
};

struct TransportChoice {
  Transport transport = Transport::mpi;
  std::string why;  // for the start-up line
  // NCCL with ranks sharing a GPU (each with its own NCCL_HOSTID): "NCCL over sockets: ranks share GPU 0
  // (test mode)"; empty otherwise.
  std::string test_mode;
  // Ranks of one host on distinct GPUs with distinct NCCL_HOSTIDs: NCCL treats them as separate hosts and
  // leaves NVLink and shared memory unused. A warning for rank 0 to print; empty otherwise.
  std::string warning;
};

// setting: "auto" | "nccl" | "mpi"; nccl_built: this binary has NCCL. Throws naming pipeline.transport when
// "nccl" is asked and cannot work, saying why and what would make it work.
TransportChoice transport_choose(const std::string& setting, const TransportRanks& ranks, bool nccl_built);

}  // namespace df
