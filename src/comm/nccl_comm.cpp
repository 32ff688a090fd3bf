// NcclComm (comm/nccl_comm.h): non-blocking NCCL communicators, the bounded wait after every call, and the
// failure messages. Only compiled with CUDA. NCCL's non-blocking mode is what makes a hang observable: a
// blocking communicator would sit inside the call, where nothing can time it out or abort it.
#include "comm/nccl_comm.h"

#include <chrono>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/primitives/cuda_check.cuh"

namespace df {

namespace {

// Busy polls within the first millisecond (an all-reduce of a small model finishes there), then sleeps.
constexpr double kSpinS = 1e-3;
constexpr auto kSleep = std::chrono::microseconds(200);
// The destructor's bound when the comm has none: finalize waits for the peers to finalize too, and a run
// that ends must not wait forever for a peer that died.
constexpr double kFinalizeS = 60;

// name: NCCL_DEBUG lines name the comm by it; it must outlive the comm (nullptr: none).
ncclConfig_t nonblocking_config(const char* name) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = name;
  return cfg;
}

}  // namespace

ncclResult_t nccl_poll(const std::function<ncclResult_t()>& check, double timeout_s, bool* timed_out,
                       double* waited_s) {
  const auto t0 = std::chrono::steady_clock::now();
  *timed_out = false;
  for (;;) {
    const ncclResult_t r = check();
    *waited_s = seconds_since(t0);
    if (r != ncclInProgress) return r;
    if (timeout_s > 0 && *waited_s >= timeout_s) {
      *timed_out = true;
      return r;
    }
    if (*waited_s > kSpinS) std::this_thread::sleep_for(kSleep);
  }
}

std::string nccl_failure_message(const NcclOpContext& c, ncclResult_t result, bool timed_out, double waited_s,
                                 double timeout_s, const char* last_error) {
  const std::string step = c.step < 0 ? "at start-up" : strfmt("in step %lld", (long long)c.step);
  const std::string why =
      timed_out
          ? strfmt("not finished after %.1f s (bound %.1f s): a peer never joined it", waited_s, timeout_s)
          : strfmt("%s after %.3f s", ncclGetErrorString(result), waited_s);
  std::string msg = strfmt("NCCL %s on the %s communicator %s (%s; peers: %s): %s", c.op.c_str(),
                           c.label.c_str(), step.c_str(), c.self.c_str(), c.peers.c_str(), why.c_str());
  if (last_error && *last_error) msg += strfmt("; NCCL says: %s", last_error);
  msg += timed_out
             ? "; the communicator was aborted. HINT: look for the peer's own error (it died, hangs, or "
               "issued its NCCL calls in another order); NCCL_DEBUG=INFO shows each rank's calls; raise "
               "run.watchdog_s if the peer is merely slow"
             : "; the communicator was aborted. HINT: rerun with NCCL_DEBUG=INFO "
               "(NCCL_DEBUG_SUBSYS=INIT,P2P,NET) to see which connection failed";
  return msg;
}

std::unique_ptr<NcclComm> NcclComm::create(MPI_Comm comm, int device, std::string label,
                                           std::vector<std::string> rank_names, double timeout_s) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  ncclUniqueId id{};
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    DF_CHECK(r == ncclSuccess,
             "ncclGetUniqueId for the %s communicator failed: %s; HINT: NCCL_DEBUG=INFO shows "
             "why (no usable network interface? set NCCL_SOCKET_IFNAME)",
             label.c_str(), ncclGetErrorString(r));
  }
  const int rc = MPI_Bcast(&id, int(sizeof(id)), MPI_BYTE, 0, comm);
  DF_CHECK(rc == MPI_SUCCESS, "MPI_Bcast of the NCCL id of the %s communicator failed (code %d)",
           label.c_str(), rc);
  return std::make_unique<NcclComm>(id, size, rank, device, std::move(label), std::move(rank_names),
                                    timeout_s);
}

NcclComm::NcclComm(const ncclUniqueId& id, int nranks, int rank, int device, std::string label,
                   std::vector<std::string> rank_names, double timeout_s)
    : NcclComm(nullptr, device, std::move(label), std::move(rank_names), timeout_s,
               std::this_thread::get_id()) {
  rank_ = rank;
  size_ = nranks;
  name_ranks();
  ncclConfig_t cfg = nonblocking_config(label_.c_str());
  // A throw from here runs the destructor (the delegated constructor has finished): fail() has already
  // aborted the comm, so it releases the stream and the event only.
  settle(ncclCommInitRankConfig(&comm_, nranks, id, rank, &cfg), "communicator set-up",
         strfmt("all %d ranks", nranks));
}

NcclComm::NcclComm(ncclComm_t comm, int device, std::string label, std::vector<std::string> rank_names,
                   double timeout_s, std::thread::id owner)
    : comm_(comm),
      device_(device),
      label_(std::move(label)),
      names_(std::move(rank_names)),
      timeout_s_(timeout_s),
      owner_(owner) {
  DF_CUDA_CHECK(cudaSetDevice(device_));
  DF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DF_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

void NcclComm::name_ranks() {
  names_.resize(size_t(size_));
  for (int r = 0; r < size_; ++r)
    if (names_[size_t(r)].empty()) names_[size_t(r)] = strfmt("rank %d", r);
}

void NcclComm::release_stream() {
  if (done_) cudaEventDestroy(done_);
  if (stream_) cudaStreamDestroy(stream_);
  done_ = nullptr;
  stream_ = nullptr;
}

NcclComm::~NcclComm() {
  if (comm_) {
    // Finalize flushes queued work and waits for the peers; bounded, then abort.
    bool timed_out = false;
    double waited = 0;
    ncclResult_t r = ncclCommFinalize(comm_);
    if (r == ncclInProgress || r == ncclSuccess)
      r = nccl_poll([this] { return state(); }, timeout_s_ > 0 ? timeout_s_ : kFinalizeS, &timed_out,
                    &waited);
    if (r == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      log_warn("NCCL: finalizing the %s communicator %s after %.1f s; aborting it", label_.c_str(),
               timed_out ? "did not finish" : ncclGetErrorString(r), waited);
      ncclCommAbort(comm_);
    }
  }
  release_stream();
}

ncclResult_t NcclComm::state() const {
  ncclResult_t s = ncclSuccess;
  const ncclResult_t q = ncclCommGetAsyncError(comm_, &s);
  return q != ncclSuccess ? q : s;
}

void NcclComm::check_thread(const char* what) const {
  DF_CHECK(std::this_thread::get_id() == owner_,
           "NCCL %s on the %s communicator from another thread than the one "
           "that created it; HINT: every NCCL call of a rank must come from one thread (comm/nccl_comm.h)",
           what, label_.c_str());
  DF_CHECK(comm_ != nullptr, "NCCL %s on the %s communicator after it was aborted by an earlier failure",
           what, label_.c_str());
}

void NcclComm::fail(ncclResult_t r, bool timed_out, double waited_s, const char* what,
                    const std::string& peers) {
  NcclOpContext c;
  c.label = label_;
  c.self = strfmt("%s, rank %d of %d, cuda:%d",
                  size_t(rank_) < names_.size() ? names_[size_t(rank_)].c_str() : "?", rank_, size_, device_);
  c.op = what;
  c.peers = peers;
  c.step = step_;
  const std::string msg =
      nccl_failure_message(c, r, timed_out, waited_s, timeout_s_, ncclGetLastError(comm_));
  if (comm_)
    ncclCommAbort(comm_);  // blocking even on a non-blocking comm: the comm's kernels are gone after it
  comm_ = nullptr;
  error_throw(__FILE__, __LINE__, msg);
}

void NcclComm::settle(ncclResult_t r, const char* what, const std::string& peers) {
  if (r == ncclSuccess) return;
  if (r != ncclInProgress) fail(r, false, 0, what, peers);
  bool timed_out = false;
  double waited = 0;
  r = nccl_poll([this] { return state(); }, timeout_s_, &timed_out, &waited);
  if (r != ncclSuccess) fail(r, timed_out, waited, what, peers);
}

void NcclComm::set_step(int64_t step, double timeout_s) {
  step_ = step;
  timeout_s_ = timeout_s;
}

void NcclComm::wait_for(cudaEvent_t e) {
  DF_CUDA_CHECK(cudaStreamWaitEvent(stream_, e, 0));
}

cudaEvent_t NcclComm::record() {
  DF_CUDA_CHECK(cudaEventRecord(done_, stream_));
  return done_;
}

void NcclComm::all_reduce_sum(float* data, size_t n, const char* what) {
  check_thread(what);
  settle(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream_), what,
         strfmt("all %d ranks", size_));
}

void NcclComm::p2p(const std::vector<NcclP2p>& ops, const char* what) {
  check_thread(what);
  std::string peers;
  for (const NcclP2p& o : ops) {
    DF_CHECK(o.peer >= 0 && o.peer < size_, "NCCL %s on the %s communicator: peer %d is not a rank of its %d",
             what, label_.c_str(), o.peer, size_);
    peers += strfmt("%s%s %s", peers.empty() ? "" : ", ", o.send ? "send to" : "receive from",
                    names_[size_t(o.peer)].c_str());
  }
  ncclResult_t r = ncclGroupStart();
  for (const NcclP2p& o : ops) {
    if (r != ncclSuccess) break;
    r = o.send ? ncclSend(o.buf, o.bytes, ncclUint8, o.peer, comm_, stream_)
               : ncclRecv(o.buf, o.bytes, ncclUint8, o.peer, comm_, stream_);
  }
  // The group must be closed even after a failed call, or NCCL's group depth stays raised on this thread.
  const ncclResult_t end = ncclGroupEnd();
  settle(r != ncclSuccess ? r : end, what, peers);
}

void NcclComm::synchronize(const char* what) {
  check_thread(what);
  wait(record(), what, strfmt("all %d ranks", size_));
}

bool NcclComm::test(cudaEvent_t e, double waited_s, const char* what, const std::string& peers) {
  check_thread(what);
  const ncclResult_t s = state();
  if (s != ncclSuccess && s != ncclInProgress) fail(s, false, waited_s, what, peers);
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaSuccess) return true;
  if (q != cudaErrorNotReady) {
    log_warn("NCCL %s: the comm stream reports %s", what, cudaGetErrorString(q));
    fail(ncclUnhandledCudaError, false, waited_s, what, peers);
  }
  if (timeout_s_ > 0 && waited_s >= timeout_s_) fail(ncclInProgress, true, waited_s, what, peers);
  return false;
}

void NcclComm::wait(cudaEvent_t e, const char* what, const std::string& peers) {
  bool timed_out = false;
  double waited = 0;
  // test() enforces the bound and throws; the poll itself is unbounded.
  nccl_poll([&] { return test(e, waited, what, peers) ? ncclSuccess : ncclInProgress; }, 0, &timed_out,
            &waited);
}

void NcclComm::warm_up(const std::vector<int>& peers) {
  check_thread("warm-up");
  // [0] the all-reduce, [1] the value sent, [2 + i] what peer i sends back.
  const size_t n = 2 + peers.size();
  float* buf = nullptr;
  DF_CUDA_CHECK(cudaMalloc(&buf, n * sizeof(float)));
  std::vector<float> host(n, 0.0f);
  host[0] = 1.0f;
  host[1] = float(rank_);
  // On the communicator's stream: it does not wait for the legacy default stream, and a pageable cudaMemcpy may
  // return before its DMA lands, so the all-reduce below could otherwise read the buffer first.
  DF_CUDA_CHECK(cudaMemcpyAsync(buf, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_));
  try {
    all_reduce_sum(buf, 1, "warm-up all-reduce");
    std::vector<NcclP2p> ops;
    for (size_t i = 0; i < peers.size(); ++i) {
      ops.push_back({true, buf + 1, sizeof(float), peers[i]});
      ops.push_back({false, buf + 2 + i, sizeof(float), peers[i]});
    }
    if (!ops.empty()) p2p(ops, "warm-up send/receive");
    synchronize("warm-up");
  } catch (...) {
    cudaFree(buf);
    throw;
  }
  DF_CUDA_CHECK(cudaMemcpy(host.data(), buf, n * sizeof(float), cudaMemcpyDeviceToHost));
  DF_CUDA_CHECK(cudaFree(buf));
  DF_CHECK(host[0] == float(size_),
           "NCCL warm-up all-reduce on the %s communicator: every rank adds 1, the sum "
           "is %g, expected %d; HINT: NCCL_DEBUG=INFO",
           label_.c_str(), host[0], size_);
  for (size_t i = 0; i < peers.size(); ++i)
    DF_CHECK(host[2 + i] == float(peers[i]),
             "NCCL warm-up on the %s communicator: %s sent %g, expected its "
             "rank %d; HINT: NCCL_DEBUG=INFO",
             label_.c_str(), names_[size_t(peers[i])].c_str(), host[2 + i], peers[i]);
}

}  // namespace df
