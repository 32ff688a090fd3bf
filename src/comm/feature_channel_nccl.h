// The NCCL payload wire of the feature channel (comm/feature_channel.h), CUDA builds only: the payload goes
// by ncclSend/ncclRecv between device slots on the world communicator's stream, ordered against the compute
// streams by events; no host copy, no pinned mirror. Exposed so a one-GPU test can pair a send to self with
// its receive in one NCCL group (NCCL needs both in one; the channel's own transfers are one per group).
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "comm/feature_channel.h"
#include "comm/nccl_comm.h"

namespace df {

class NcclWire final : public PayloadWire {
 public:
  // comm: the NCCL world communicator (comm ranks = world ranks); pool: device slots (no mirrors needed).
  NcclWire(NcclComm& comm, WirePool& pool);
  ~NcclWire() override;
  NcclWire(const NcclWire&) = delete;
  NcclWire& operator=(const NcclWire&) = delete;

  void stage(int, size_t) override {}
  bool staged(int) override { return true; }  // the comm stream waits for the forward itself
  void post(int slot, size_t n, int to, int64_t batch, MPI_Request* req) override;
  bool left(int slot) override;
  void receive(int slot, size_t n, int from, int64_t batch) override;
  void arrived(int slot) override;

  // The two halves of post / receive around the NCCL call. begin: the comm stream waits for the compute
  // stream's work queued so far; returns the transfer for NcclComm::p2p. end, after p2p returned: the slot's
  // event marks the transfer's end (receiving, the compute stream's later work waits for it).
  NcclP2p begin(int slot, bool send, size_t n, int peer, int64_t batch);
  void end(int slot);
  // "feature payload send of batch 12" / "... recv of ...": what the slot's last transfer is called.
  const std::string& what(int slot) const { return at(slot).what; }

 private:
  struct Slot {
    cudaEvent_t done = nullptr;
    bool send = false, pending = false;  // pending: posted, its end not yet seen
    std::string what, peers;
    std::chrono::steady_clock::time_point posted;
  };
  Slot& at(int slot);
  const Slot& at(int slot) const;

  NcclComm& comm_;
  WirePool& pool_;
  std::vector<Slot> slots_;
};

}  // namespace df
