// MPI bootstrap: process identity, role resolution (DESIGN.md "Roles and placement"), the communicators
// every rank needs, the start-up line, and the stop signals (SIGTERM / SIGUSR1) that end a run cleanly.
#pragma once
#include <mpi.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "comm/transport.h"
#include "topo/rankfile.h"
#include "topo/role_move.h"

namespace df {

class NcclComm;  // comm/nccl_comm.h (CUDA builds)

struct RoleMap {
  std::vector<RankRole> role;  // per world rank
  std::vector<int> gpu;        // per world rank; -1 = from the rank's index on its host
  std::vector<int> targets;    // world ranks of the targets, in order (target index = position)
  std::vector<int> drafters;   // world ranks of the drafters, in order
  std::vector<std::string> hosts;  // per world rank: the host it runs on (failure messages name it)
  std::vector<int> numa;       // per world rank: its NUMA node from the rankfile's numa=, -1 unknown
  std::vector<bool> pinned;    // per world rank: rebalancing never moves it (rankfile `pinned`, roles_pin)
  std::string source;          // where the roles came from, for the start-up line
  std::string host_mismatch;   // non-empty: the rankfile placed a rank on another host than it runs on
};

// Resolves roles, first that applies: rankfile_cli (or DFLASH_RANKFILE; "none" skips rankfiles);
// OMPI_MCA_orte_rankfile; the
// [topology] section (targets first, then drafters); the default (one drafter per host, on its last rank).
// hosts: the host name of every world rank. Throws with a message naming the source when the map does not
// match the world size or lacks a target or a drafter.
RoleMap roles_resolve(const std::string& rankfile_cli, const TopologySection& topo, const std::vector<std::string>& hosts);

// Pins pipeline.rebalance_pinned's world ranks; throws naming the key when a rank is not in the world.
void roles_pin(RoleMap& m, const std::vector<int>& ranks);
// The ranks as the role move sees them (topo/role_move.h); gpus: every world rank's GPU (-1 on CPU runs).
std::vector<RoleSlot> roles_slots(const RoleMap& m, const std::vector<int>& gpus);
// The map after `moved` (role_move_pick) change role: each role keeps its ranks' order and appends the ranks
// that join it, so drafter 0 and every rank that stays keep their index.
RoleMap roles_after_move(const RoleMap& m, const std::vector<int>& moved);

// "h1 [ranks 0=target0 1=drafter0]; h2 [ranks 2=target1 3=drafter1]": rank 0's start-up table, and what a
// failure message names when a host's ranks are lost. roles_label gives one rank's "2=target1".
std::string roles_by_host(const RoleMap& m);
std::string roles_label(const RoleMap& m, int rank);

struct DistContext {
  int rank = 0, world = 1;
  std::string host;
  int local_rank = 0, local_size = 1;  // among ranks on this host (MPI_Comm_split_type)
  RoleMap roles;
  RankRole role = RankRole::target;
  int gpu = -1;               // this rank's GPU (-1 on CPU runs)
  std::vector<int> gpus;      // every world rank's GPU (-1 on CPU runs)
  std::vector<std::string> hosts;  // every world rank's host
  Transport transport = Transport::mpi;  // features and gradients (pipeline.transport)
  int target_index = -1;      // position among targets, or -1
  int drafter_index = -1;     // position among drafters, or -1
  MPI_Comm data_comm = MPI_COMM_NULL;     // feature channel traffic (a dup of world)
  MPI_Comm drafter_comm = MPI_COMM_NULL;  // drafters only: gradient all-reduce
  // transport nccl only (null otherwise): every rank's world communicator, warmed up between every target and
  // every drafter, and the drafters' own communicator for the gradient all-reduce (null on targets).
  std::shared_ptr<NcclComm> nccl_world, nccl_drafters;
  int num_targets() const { return int(roles.targets.size()); }
  int num_drafters() const { return int(roles.drafters.size()); }
};

// MPI_Init_thread (funneled), identity, roles, communicators, the transport. Prints one start-up line per rank.
// use_gpus: GPU ids come from the rankfile `gpu=` annotation or the local rank; otherwise the device is cpu.
// transport: pipeline.transport ("auto" | "nccl" | "mpi"). silence_watch: end the job when a rank stops sending
// heartbeats (comm/host_watch.h); off with run.watchdog_s = 0, e.g. to attach a debugger.
DistContext dist_init(const std::string& rankfile_cli, const TopologySection& topo, bool use_gpus,
                      const std::string& transport = "auto", bool silence_watch = true);
// Transport nccl: the NCCL communicators (nccl_world, nccl_drafters), created and warmed up collectively on
// this thread, which must then issue every NCCL call of the rank. Called after the run's plan is checked, so
// a config that cannot run fails on its own message first. bounded: every NCCL wait has a bound (false with
// run.watchdog_s = 0). Nothing with the MPI transport.
void dist_nccl_start(DistContext& ctx, bool bounded);
// Names `step` in an NCCL communicator's wait messages and bounds its waits by timeout_s; nothing when comm is
// null (the MPI transport, and every build without CUDA).
void dist_nccl_set_step(NcclComm* comm, int64_t step, double timeout_s);
void dist_finalize(DistContext& ctx);

// A role move within the same MPI world (pipeline/rebalance.h), after every rank's loop has returned:
// dist_nccl_stop destroys the NCCL communicators (collective; nothing with the MPI transport); dist_reform
// takes the new roles, re-splits drafter_comm, re-dups data_comm (so no message of the old wiring can reach
// the new one), prints each rank's start-up line again, and then dist_nccl_start builds NCCL for the new roles.
void dist_nccl_stop(DistContext& ctx);
void dist_reform(DistContext& ctx, const RoleMap& roles);

// SIGTERM and SIGUSR1 set a flag; the training loops agree on a step, checkpoint and exit 0. So does the file
// that DFLASH_STOP_FILE names (read by signals_install) once it exists: the SLURM batch scripts create it on
// USR1 instead of signalling ranks that may not have installed their handler yet (launch/slurm/*.sbatch).
void signals_install();
bool signals_stop_requested();  // asks the file system only while no signal has come (a few calls a step)

}  // namespace df
