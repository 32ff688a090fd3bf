// The target→drafter feature channel (DESIGN.md "Wire format"). A fixed-size header goes over MPI; so do the
// batch's small host arrays (offsets, token ids, loss mask) and the credits. Its bf16 payload (features
// [T, k·H], then the optional final hidden [T, H]) lives in a slot of the rank's WirePool (ops/wire_pool.h)
// and crosses on a PayloadWire: over MPI through the slots' pinned mirrors (copied off the compute stream),
// or, on GPU ranks with transport nccl, by ncclSend/ncclRecv between the device slots, ordered by events. A
// CUDA target's forward writes the slot on the device; a CUDA drafter trains from its own slot in place. Flow
// control is by credits: a drafter grants `depth` credits per target and returns one each time it takes a
// batch off the channel, so a target never has more than `depth` unconsumed batches in flight to any drafter.
//
// Shutdown: drafters send STOP to every target when they are done (end of training or an agreed signal
// stop), then drain each target until its END header, in batch order (an NCCL stream runs its transfers in
// the order they were posted, so a drafter that drained one target before the next could wait on a target
// whose stream waits on another drafter). A target that sees STOP from every drafter stops producing, sends
// END to every drafter and completes its outstanding sends.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "ops/wire_pool.h"

namespace df {

struct FeatureHeader {
  int64_t batch_id = 0;  // global batch index
  int64_t epoch = 0;
  int64_t num_seqs = 0;
  int64_t tokens = 0;
  int64_t feat_cols = 0;     // k·H
  int64_t final_cols = 0;    // H when the final hidden travels (soft-KL), else 0
  int64_t flags = 0;         // kFlagEnd, kFlagStopRequested
  double target_busy_s = 0;  // the target's forward + packing time for this batch (throughput metric)
  // The target's time inside its send path for its previous batch (FeatureSender::send_path_s): the cost of
  // streaming, beside target_busy_s. One batch behind, since a batch's own send ends after its header left.
  double target_send_s = 0;
  int64_t q_pre = 0;         // the target's prefetch queue depth when it sent
  static constexpr int64_t kFlagEnd = 1;            // no more batches from this target
  static constexpr int64_t kFlagStopRequested = 2;  // this target received SIGTERM / SIGUSR1
};

struct FeaturePacket {
  FeatureHeader hdr;
  std::vector<int64_t> offsets;    // S+1
  std::vector<int32_t> tokens;     // T
  std::vector<uint8_t> loss_mask;  // T
  // A packet off the channel: its payload in the receiver's wire slot (WireLayout), in `slot_device` memory,
  // valid until the receiver's next recv. Null for a packet built on the host (offline feature files,
  // held-out data), whose payload is in the two vectors below.
  const char* slot = nullptr;
  Device slot_device = Device::cpu;
  std::vector<uint16_t> features;      // bf16 [T, feat_cols]
  std::vector<uint16_t> final_hidden;  // bf16 [T, final_cols]
};

// Target side.
class FeatureSender {
 public:
  virtual ~FeatureSender() = default;
  // The slot of the sender's pool that the next batch's payload goes into (WireLayout): waits until the batch
  // it last held has left this rank.
  virtual char* acquire() = 0;
  // Sends p (header and host arrays; the payload is in the acquired slot, written by work already queued on
  // the compute stream) to drafter `drafter` once a credit is held. Returns without waiting for the payload
  // to leave. Returns false (and sends nothing) when the drafters have stopped the run.
  virtual bool send(int drafter, FeaturePacket&& p) = 0;
  // True once every drafter has sent STOP.
  virtual bool stopped() = 0;
  // Waits for STOP from every drafter, sends END to each, completes every outstanding send.
  virtual void finish() = 0;
  // Seconds spent so far inside send() once a credit was held: packing the host arrays, staging the payload
  // (the MPI wire's copy issue), posting it and polling the wire. Waits for a credit are the drafters'
  // back-pressure and stay out.
  virtual double send_path_s() const = 0;
};

// Drafter side.
class FeatureReceiver {
 public:
  virtual ~FeatureReceiver() = default;
  // The next batch from target `target` (in that target's send order); returns its credit.
  virtual FeaturePacket recv(int target) = 0;
  // Batches that have arrived (headers waiting) from the given targets: the q_hs metric.
  virtual int pending(const std::vector<int>& targets) = 0;
  // STOP to every target, then drain every batch still coming, in batch order, until each target's END.
  virtual void finish() = 0;
};

// How a batch's payload crosses from a target's slot to a drafter's; the header, host arrays and credits are
// the channel's. `batch` names the transfer in failure messages.
class PayloadWire {
 public:
  virtual ~PayloadWire() = default;
  // Target side. stage: the slot's first n bytes (written by work queued on the compute stream) are to go
  // out; staged: they may be posted now (MPI: once they reached the pinned mirror).
  virtual void stage(int slot, size_t n) = 0;
  virtual bool staged(int slot) = 0;
  // Puts them on the wire to world rank `to`; an MPI wire fills *req, which the channel completes with the
  // header's. left: the slot's posted payload has left it (beyond *req); throws past the wire's bound.
  virtual void post(int slot, size_t n, int to, int64_t batch, MPI_Request* req) = 0;
  virtual bool left(int slot) = 0;
  // Drafter side: queues the receipt of n bytes from world rank `from` into the slot, after the compute
  // stream's work queued so far (which may still read the slot); the compute stream's later work sees them.
  // arrived: blocks, within the wire's bound, until they have landed.
  virtual void receive(int slot, size_t n, int from, int64_t batch) = 0;
  virtual void arrived(int slot) = 0;
};

// The batches a drafter takes off the channel: next, next + stride, ... (batch b from target b % T), so that
// it drains the targets in batch order at the end of a run.
struct DrafterBatches {
  int64_t next = 0;  // the first batch of this run: TrainPlan::batch_of(start_step, 0, drafter)
  int stride = 1;    // the number of drafters
};
// Which targets send batches to drafter `d` of `num_drafters` (batch b goes from target b % T to drafter
// b % D): those with t ≡ d (mod gcd(T, D)). The others only send it END.
std::vector<bool> feature_sources(int num_targets, int num_drafters, int d);

// The channel over `comm` with the payload on `wire`; targets/drafters are world ranks in `comm` (index =
// role index). The pool, which holds the payloads (its depth bounds the batches in flight from a target, its
// slots one batch at the token budget), must outlive the channel, which owns the wire.
std::unique_ptr<FeatureSender> feature_sender(MPI_Comm comm, std::vector<int> drafters, int depth,
                                              WirePool& pool, std::unique_ptr<PayloadWire> wire);
std::unique_ptr<FeatureReceiver> feature_receiver(MPI_Comm comm, std::vector<int> targets,
                                                  DrafterBatches order, WirePool& pool,
                                                  std::unique_ptr<PayloadWire> wire);

// The payload over MPI from/into the slots' host bytes (a device pool's pinned mirrors).
std::unique_ptr<PayloadWire> payload_wire_mpi(MPI_Comm comm, WirePool& pool);
std::unique_ptr<FeatureSender> feature_sender_mpi(MPI_Comm comm, std::vector<int> drafters, int depth,
                                                  WirePool& pool);
std::unique_ptr<FeatureReceiver> feature_receiver_mpi(MPI_Comm comm, std::vector<int> targets,
                                                      DrafterBatches order, WirePool& pool);

// CUDA builds (feature_channel_nccl.h): the payload by NCCL between device slots. world: the NCCL world
// communicator, whose ranks are the world ranks of the channel's comm; its one thread issues every call.
class NcclComm;
std::unique_ptr<PayloadWire> payload_wire_nccl(NcclComm& world, WirePool& pool);
// The run's wire: NCCL when `nccl` (the world communicator, transport nccl), else MPI over comm. A pool for
// the NCCL wire needs no host mirrors (WirePool's `mirrors`).
std::unique_ptr<PayloadWire> payload_wire(MPI_Comm comm, NcclComm* nccl, WirePool& pool);

}  // namespace df
