// NcclComm: one NCCL communicator with its own stream, created non-blocking so that no NCCL call can hang the
// rank: every call is followed by a bounded wait that polls ncclCommGetAsyncError and, on an error or when
// the bound passes, aborts the communicator and throws naming the rank, the peer, the operation and the step.
#pragma once
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace df {

// Polls check() until it returns anything but ncclInProgress, or until timeout_s (<= 0: no bound) passes.
// Returns what check() returned last; on a timeout ncclInProgress with *timed_out set. Sleeps a little
// between polls after the first millisecond, so a long wait does not burn the core the compute thread needs.
ncclResult_t nccl_poll(const std::function<ncclResult_t()>& check, double timeout_s, bool* timed_out,
                       double* waited_s);

// What a failure message names: the communicator, this rank, the operation, its peers and the step.
struct NcclOpContext {
  std::string label;  // the communicator, e.g. "world" or "drafters"
  std::string self;   // this rank, e.g. "drafter 1 (world rank 3), rank 1 of 2"
  std::string op;     // e.g. "gradient all-reduce"
  std::string peers;  // e.g. "all 2 ranks" or "target 0 (world rank 0)"
  int64_t step = -1;  // -1: before the first step (start-up)
};
// "NCCL gradient all-reduce failed on the drafters communicator (...): <why>; HINT: ...".
std::string nccl_failure_message(const NcclOpContext& c, ncclResult_t result, bool timed_out, double waited_s,
                                 double timeout_s, const char* last_error);

// One point-to-point transfer of a p2p() group: `bytes` from/to device memory `buf`, with comm rank `peer`.
struct NcclP2p {
  bool send = true;
  void* buf = nullptr;
  size_t bytes = 0;
  int peer = 0;
};

// Threading contract: every NCCL call of a rank, on every one of its communicators, is issued from ONE thread
// (the thread that created the comm; each call checks it) and in the same order on
// every rank: NCCL matches operations by their order, so a rank that mixes p2p and collectives in another
// order than its peers deadlocks them. Operations are queued on the comm's own non-blocking stream: order them
// against a compute stream with wait_for(event) before and cudaStreamWaitEvent(compute, record()) after.
class NcclComm {
 public:
  // Collective over `comm`: its rank 0 makes the NCCL id and broadcasts it. device: this rank's GPU.
  // rank_names[r]: how messages name comm rank r (empty: "rank r"). timeout_s: the bound of every wait
  // (<= 0: none; set_step changes it).
  static std::unique_ptr<NcclComm> create(MPI_Comm comm, int device, std::string label,
                                          std::vector<std::string> rank_names, double timeout_s);
  // Without MPI: every rank passes the same id (tests, and other bootstraps).
  NcclComm(const ncclUniqueId& id, int nranks, int rank, int device, std::string label,
           std::vector<std::string> rank_names, double timeout_s);
  ~NcclComm();  // finalizes within the bound, else aborts; never throws
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Start-up, collective: a 1-element all-reduce (checked: it must sum to size()) and, with peers, one
  // 1-element send and receive with each, so NCCL's lazy connection set-up happens here, not in step 1.
  void warm_up(const std::vector<int>& peers);

  // The step named by failure messages from now on, and the bound of each wait (<= 0: none).
  void set_step(int64_t step, double timeout_s);

  void wait_for(cudaEvent_t e);  // the comm stream waits for e (recorded by the caller on its stream)
  cudaEvent_t record();          // an event marking the end of everything queued so far on the comm stream
  // In place, sum over all ranks; device memory.
  void all_reduce_sum(float* data, size_t n, const char* what);
  // One group of sends and receives (device memory); send to self needs the matching receive in the group.
  void p2p(const std::vector<NcclP2p>& ops, const char* what);
  // Host waits, within the bound, until everything queued on the comm stream has finished.
  void synchronize(const char* what);
  // Whether event e (recorded on the comm stream after an operation) has completed, for a caller that polls
  // while it does other work; waited_s: how long it has been waited for. Past the bound, or on an NCCL
  // error, aborts and throws naming `what` and `peers` (e.g. "send to drafter 0 (world rank 1)").
  bool test(cudaEvent_t e, double waited_s, const char* what, const std::string& peers);
  // Host waits for e within the bound, as test() does.
  void wait(cudaEvent_t e, const char* what, const std::string& peers);

  int rank() const { return rank_; }
  int size() const { return size_; }
  cudaStream_t stream() const { return stream_; }
  const std::string& rank_name(int r) const { return names_[size_t(r)]; }

 private:
  NcclComm(ncclComm_t comm, int device, std::string label, std::vector<std::string> rank_names,
           double timeout_s, std::thread::id owner);
  void name_ranks();      // fills names_ to size_ entries, "rank r" where none was given
  void release_stream();  // the stream and the event
  // After an NCCL call that returned r: waits until the comm leaves ncclInProgress; aborts and throws on an
  // error or when the bound passes.
  void settle(ncclResult_t r, const char* what, const std::string& peers);
  [[noreturn]] void fail(ncclResult_t r, bool timed_out, double waited_s, const char* what,
                         const std::string& peers);
  void check_thread(const char* what) const;
  ncclResult_t state() const;  // ncclCommGetAsyncError: ncclInProgress while a call is still being set up

  ncclComm_t comm_ = nullptr;
  int device_ = 0, rank_ = 0, size_ = 1;
  std::string label_;
  std::vector<std::string> names_;
  double timeout_s_ = 0;
  int64_t step_ = -1;
  std::thread::id owner_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

}  // namespace df
