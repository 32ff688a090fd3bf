// The target→drafter feature channel (DESIGN.md "Wire format"). A fixed-size header goes over MPI; so do the
// batch's small host arrays (offsets, token ids, loss mask) and its bf16 payload (features [T, k·H], then the
// optional final hidden [T, H]). The payload lives in a slot of the rank's WirePool (ops/wire_pool.h): a CUDA
// target's forward writes it there on the device and it crosses the host through the slot's pinned mirror,
// copied off the compute stream; a CUDA drafter receives into its own pool and trains from the slot in place.
// NCCL on GPU ranks implements the same interface. Flow control is by credits: a drafter grants `depth`
// credits per target and returns one each time it takes a batch off the channel, so a target never has more
// than `depth` unconsumed batches in flight to any drafter.
//
// Shutdown: drafters send STOP to every target when they are done (end of training or an agreed signal
// stop), then drain each target until its END header. A target that sees STOP from every drafter stops
// producing, sends END to every drafter and completes its outstanding sends.
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
  // the compute stream) to drafter `drafter` once a credit is held. Returns without waiting for the payload's
  // copy to the wire. Returns false (and sends nothing) when the drafters have stopped the run.
  virtual bool send(int drafter, FeaturePacket&& p) = 0;
  // True once every drafter has sent STOP.
  virtual bool stopped() = 0;
  // Waits for STOP from every drafter, sends END to each, completes every outstanding send.
  virtual void finish() = 0;
};

// Drafter side.
class FeatureReceiver {
 public:
  virtual ~FeatureReceiver() = default;
  // The next batch from target `target` (in that target's send order); returns its credit.
  virtual FeaturePacket recv(int target) = 0;
  // Batches that have arrived (headers waiting) from the given targets: the q_hs metric.
  virtual int pending(const std::vector<int>& targets) = 0;
  // STOP to every target, then drain each until its END.
  virtual void finish() = 0;
};

// MPI implementations over `comm`; targets/drafters are world ranks in `comm` (index = role index). The pool
// holds the payloads (its depth bounds the batches in flight from a target, its slots one batch at the token
// budget); it must outlive the channel.
std::unique_ptr<FeatureSender> feature_sender_mpi(MPI_Comm comm, std::vector<int> drafters, int depth,
                                                  WirePool& pool);
std::unique_ptr<FeatureReceiver> feature_receiver_mpi(MPI_Comm comm, std::vector<int> targets,
                                                      WirePool& pool);

}  // namespace df
