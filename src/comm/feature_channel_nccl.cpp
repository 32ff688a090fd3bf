// The feature channel with its payload over NCCL (comm/feature_channel_nccl.h): the protocol is the MPI
// channel's (feature_channel_mpi.cpp), only the payload wire differs. Every wait is bounded by the world
// communicator's bound (NcclComm::set_step) and names the batch, the peer and the step.
//
// Order (NCCL matches p2p by issue order per peer, and mixed p2p and collectives out of order can hang): a
// rank's main thread issues every call. A target uses only the world communicator and sends in batch order;
// a drafter receives in batch order (the drain too), so on every rank's world stream the transfers run in
// increasing batch id and the lowest one outstanding always has both ends posted. A drafter waits for each
// payload (arrived) before it trains on it and so before the step's all-reduce on the drafters'
// communicator, and the reducer waits for that all-reduce before the next receive is posted: a drafter's
// two communicators never have work in flight at once, so nothing of one can wait behind the other.
#include "comm/feature_channel_nccl.h"

#include "core/clock.h"
#include "core/error.h"
#include "kernels/primitives/cuda_check.cuh"

namespace df {

NcclWire::NcclWire(NcclComm& comm, WirePool& pool) : comm_(comm), pool_(pool), slots_(size_t(pool.depth())) {
  DF_CHECK(pool.device() == Device::cuda,
           "the NCCL feature wire needs device slots, but this rank's wire pool is on the CPU; HINT: "
           "pipeline.transport = \"nccl\" needs target.device and drafter.device = \"cuda\"");
  for (Slot& s : slots_) DF_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
}

NcclWire::~NcclWire() {
  for (Slot& s : slots_) cudaEventDestroy(s.done);
}

NcclWire::Slot& NcclWire::at(int slot) {
  DF_CHECK(slot >= 0 && slot < int(slots_.size()), "NCCL feature wire: slot %d outside [0, %zu)", slot,
           slots_.size());
  return slots_[size_t(slot)];
}
const NcclWire::Slot& NcclWire::at(int slot) const {
  return const_cast<NcclWire*>(this)->at(slot);
}

NcclP2p NcclWire::begin(int slot, bool send, size_t n, int peer, int64_t batch) {
  Slot& s = at(slot);
  DF_CHECK(n <= pool_.bytes(), "NCCL feature wire: %zu bytes exceed the %zu-byte slot", n, pool_.bytes());
  // The forward that wrote the slot (sending), or the training that still reads its last batch (receiving).
  pool_.stream_after_compute(comm_.stream());
  s.send = send;
  s.what = strfmt("feature payload %s of batch %lld", send ? "send" : "recv", (long long)batch);
  s.peers = strfmt("%s %s", send ? "send to" : "receive from", comm_.rank_name(peer).c_str());
  return NcclP2p{send, pool_.data(slot), n, peer};
}

void NcclWire::end(int slot) {
  Slot& s = at(slot);
  DF_CUDA_CHECK(cudaEventRecord(s.done, comm_.stream()));
  if (!s.send) pool_.compute_after(s.done);
  s.pending = true;
  s.posted = std::chrono::steady_clock::now();
}

void NcclWire::post(int slot, size_t n, int to, int64_t batch, MPI_Request*) {
  const NcclP2p op = begin(slot, true, n, to, batch);  // names the slot's operation, which p2p then reports
  comm_.p2p({op}, at(slot).what.c_str());
  end(slot);
}

bool NcclWire::left(int slot) {
  Slot& s = at(slot);
  if (!s.pending) return true;
  const double waited = seconds_since(s.posted);
  s.pending = !comm_.test(s.done, waited, s.what.c_str(), s.peers);
  return !s.pending;
}

void NcclWire::receive(int slot, size_t n, int from, int64_t batch) {
  const NcclP2p op = begin(slot, false, n, from, batch);
  comm_.p2p({op}, at(slot).what.c_str());
  end(slot);
}

void NcclWire::arrived(int slot) {
  Slot& s = at(slot);
  if (s.pending) comm_.wait(s.done, s.what.c_str(), s.peers);
  s.pending = false;
}

std::unique_ptr<PayloadWire> payload_wire_nccl(NcclComm& world, WirePool& pool) {
  return std::make_unique<NcclWire>(world, pool);
}

}  // namespace df
