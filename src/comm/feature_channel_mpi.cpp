// The feature channel's protocol over MPI point-to-point (header, host arrays, credits, STOP/END), whatever
// wire carries the payload, and the MPI payload wire. Sends are non-blocking and kept alive until complete;
// every wait is a polling loop that also watches for STOP, so a target never blocks in a call the drafters
// will not answer.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "core/clock.h"
#include "core/error.h"
#include "comm/feature_channel.h"

namespace df {

namespace {

enum Tag : int { kTagHeader = 101, kTagMeta = 102, kTagCredit = 103, kTagStop = 104, kTagPayload = 105 };

size_t align8(size_t n) { return (n + 7) / 8 * 8; }

// The batch's small host arrays travel in one message; its payload in another, straight from the slot.
size_t meta_bytes(const FeatureHeader& h) {
  const size_t T = size_t(h.tokens);
  return align8(8 * size_t(h.num_seqs + 1)) + align8(4 * T) + align8(T);
}

size_t payload_bytes(const FeatureHeader& h) { return WireLayout::bytes(h.tokens, h.feat_cols, h.final_cols); }

std::vector<char> meta_pack(const FeaturePacket& p) {
  std::vector<char> buf(meta_bytes(p.hdr));
  char* w = buf.data();
  auto put = [&](const void* src, size_t n) {
    if (n) std::memcpy(w, src, n);
    w += align8(n);
  };
  put(p.offsets.data(), 8 * p.offsets.size());
  put(p.tokens.data(), 4 * p.tokens.size());
  put(p.loss_mask.data(), p.loss_mask.size());
  return buf;
}

void meta_unpack(const std::vector<char>& buf, FeaturePacket& p) {
  const FeatureHeader& h = p.hdr;
  const size_t T = size_t(h.tokens);
  const char* r = buf.data();
  auto get = [&](auto& vec, size_t count) {
    vec.resize(count);
    size_t n = count * sizeof(vec[0]);
    if (n) std::memcpy(vec.data(), r, n);
    r += align8(n);
  };
  get(p.offsets, size_t(h.num_seqs + 1));
  get(p.tokens, T);
  get(p.loss_mask, T);
}

int checked_count(size_t bytes) {
  DF_CHECK(bytes <= size_t(INT32_MAX), "feature payload of %zu bytes exceeds MPI's 2 GiB count; HINT: lower "
           "data.token_budget",
           bytes);
  return int(bytes);
}

// Sleep between polls: short enough not to add latency to a CPU pipeline, long enough not to spin a core.
void poll_pause() { std::this_thread::sleep_for(std::chrono::microseconds(200)); }

// The payload from the slot's host bytes and into them, then to the device.
class MpiWire final : public PayloadWire {
 public:
  MpiWire(MPI_Comm comm, WirePool& pool) : comm_(comm), pool_(pool) {}
  void stage(int slot, size_t n) override { pool_.to_host(slot, n); }
  bool staged(int slot) override { return pool_.copied(slot); }
  void post(int slot, size_t n, int to, int64_t, MPI_Request* req) override {
    MPI_Isend(pool_.host(slot), checked_count(n), MPI_BYTE, to, kTagPayload, comm_, req);
  }
  bool left(int) override { return true; }
  void receive(int slot, size_t n, int from, int64_t) override {
    // The slot's host mirror is free once its last copy to the device is done; the device side is guarded
    // by the pool (the copy waits for the work already queued, which may still read the slot's last batch).
    pool_.wait(slot);
    MPI_Recv(pool_.host(slot), checked_count(n), MPI_BYTE, from, kTagPayload, comm_, MPI_STATUS_IGNORE);
    pool_.to_device(slot, n);
  }
  void arrived(int) override {}  // receive() returned with the bytes

 private:
  MPI_Comm comm_;
  WirePool& pool_;
};

class ChannelSender final : public FeatureSender {
 public:
  ChannelSender(MPI_Comm comm, std::vector<int> drafters, int depth, WirePool& pool,
                std::unique_ptr<PayloadWire> wire)
      : comm_(comm),
        drafters_(std::move(drafters)),
        credits_(drafters_.size(), depth),
        stop_seen_(drafters_.size(), false),
        pool_(pool),
        wire_(std::move(wire)),
        busy_(size_t(pool.depth()), false) {}

  char* acquire() override {
    slot_ = next_;
    next_ = (next_ + 1) % pool_.depth();
    while (busy_[size_t(slot_)]) {
      poll();
      if (busy_[size_t(slot_)]) poll_pause();
    }
    return pool_.data(slot_);
  }

  bool send(int d, FeaturePacket&& p) override {
    DF_CHECK(slot_ >= 0, "feature channel: send() without acquire() (internal error)");
    DF_CHECK(payload_bytes(p.hdr) <= pool_.bytes(), "feature channel: a batch of %lld tokens needs %zu payload "
             "bytes but the wire slots hold %zu; HINT: all ranks must run the same data.token_budget",
             (long long)p.hdr.tokens, payload_bytes(p.hdr), pool_.bytes());
    while (credits_[d] == 0) {
      poll();
      if (stopped()) return false;
      if (credits_[d] == 0) poll_pause();
    }
    if (stopped()) return false;
    const auto t_credit = std::chrono::steady_clock::now();
    --credits_[d];
    auto f = std::make_unique<Inflight>();
    f->drafter = d;
    f->slot = slot_;
    f->hdr = p.hdr;
    f->meta = meta_pack(p);
    wire_->stage(slot_, payload_bytes(p.hdr));
    busy_[size_t(slot_)] = true;
    slot_ = -1;
    staged_.push_back(std::move(f));
    poll();
    send_path_s_ += seconds_since(t_credit);
    return true;
  }

  double send_path_s() const override { return send_path_s_; }

  bool stopped() override {
    poll();
    for (bool s : stop_seen_)
      if (!s) return false;
    return true;
  }

  void finish() override {
    while (!stopped()) poll_pause();
    // Batches still staging go out first: the drafters drain every batch up to END.
    while (!staged_.empty()) {
      poll();
      if (!staged_.empty()) poll_pause();
    }
    for (size_t d = 0; d < drafters_.size(); ++d) {
      auto end = std::make_unique<Inflight>();
      end->drafter = int(d);
      end->hdr.flags = FeatureHeader::kFlagEnd;
      post(std::move(end));
    }
    while (!inflight_.empty()) {
      poll();
      if (!inflight_.empty()) poll_pause();
    }
    // Credits returned after the last batch are still queued: take them so no message outlives the run.
    int flag = 1;
    while (flag) {
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kTagCredit, comm_, &flag, &st);
      if (flag) {
        int64_t dummy;
        MPI_Recv(&dummy, 1, MPI_INT64_T, st.MPI_SOURCE, kTagCredit, comm_, MPI_STATUS_IGNORE);
      }
    }
  }

 private:
  struct Inflight {
    int drafter = 0;
    int slot = -1;  // -1: END, no payload
    FeatureHeader hdr;
    std::vector<char> meta;
    MPI_Request req[3] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  };

  void post(std::unique_ptr<Inflight> f) {
    const int dst = drafters_[size_t(f->drafter)];
    MPI_Isend(&f->hdr, int(sizeof(FeatureHeader)), MPI_BYTE, dst, kTagHeader, comm_, &f->req[0]);
    if (f->slot >= 0) {
      MPI_Isend(f->meta.data(), checked_count(f->meta.size()), MPI_BYTE, dst, kTagMeta, comm_, &f->req[1]);
      wire_->post(f->slot, payload_bytes(f->hdr), dst, f->hdr.batch_id, &f->req[2]);
    }
    inflight_.push_back(std::move(f));  // heap-held: MPI keeps pointers into hdr and meta
  }

  void poll() {
    for (size_t d = 0; d < drafters_.size(); ++d) {
      for (;;) {
        int flag = 0;
        MPI_Iprobe(drafters_[d], kTagCredit, comm_, &flag, MPI_STATUS_IGNORE);
        if (!flag) break;
        int64_t n = 0;
        MPI_Recv(&n, 1, MPI_INT64_T, drafters_[d], kTagCredit, comm_, MPI_STATUS_IGNORE);
        credits_[d] += int(n);
      }
      if (!stop_seen_[d]) {
        int flag = 0;
        MPI_Iprobe(drafters_[d], kTagStop, comm_, &flag, MPI_STATUS_IGNORE);
        if (flag) {
          int64_t dummy;
          MPI_Recv(&dummy, 1, MPI_INT64_T, drafters_[d], kTagStop, comm_, MPI_STATUS_IGNORE);
          stop_seen_[d] = true;
        }
      }
    }
    // Staged batches go on the wire in order (an NCCL peer matches them by it), each once it may.
    while (!staged_.empty() && wire_->staged(staged_.front()->slot)) {
      post(std::move(staged_.front()));
      staged_.pop_front();
    }
    // Completed sends free their slots (a drafter may take its batches in another order than the sends').
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      int done = 0;
      MPI_Testall(3, (*it)->req, &done, MPI_STATUSES_IGNORE);
      // The wire is asked even while MPI's part is pending: its own bound (an NCCL send to a drafter that
      // stopped receiving) must fire whether or not that drafter took the batch's header and meta first.
      const bool wire_done = (*it)->slot < 0 || wire_->left((*it)->slot);
      done = done && wire_done;
      if (!done) {
        ++it;
        continue;
      }
      if ((*it)->slot >= 0) busy_[size_t((*it)->slot)] = false;
      it = inflight_.erase(it);
    }
  }

  MPI_Comm comm_;
  std::vector<int> drafters_;
  std::vector<int> credits_;
  std::vector<bool> stop_seen_;
  WirePool& pool_;
  std::unique_ptr<PayloadWire> wire_;
  std::vector<bool> busy_;  // per slot: its batch is staged or on the wire
  int next_ = 0, slot_ = -1;
  std::deque<std::unique_ptr<Inflight>> staged_, inflight_;
  double send_path_s_ = 0;
};

class ChannelReceiver final : public FeatureReceiver {
 public:
  // The sender starts with `depth` credits per drafter, so the receiver has nothing to announce.
  ChannelReceiver(MPI_Comm comm, std::vector<int> targets, DrafterBatches order, WirePool& pool,
                  std::unique_ptr<PayloadWire> wire)
      : comm_(comm), targets_(std::move(targets)), order_(order), pool_(pool), wire_(std::move(wire)) {
    DF_CHECK(order_.stride >= 1, "feature channel: %d drafters (internal error)", order_.stride);
  }

  FeaturePacket recv(int t) override {
    FeaturePacket p = recv_one(t);
    order_.next = p.hdr.batch_id + order_.stride;
    DF_CHECK(!(p.hdr.flags & FeatureHeader::kFlagEnd),
             "target %d (rank %d) ended its stream while drafters still expected batches; HINT: did the target "
             "run out of data? check both ranks' configs are identical",
             t, targets_[t]);
    int64_t one = 1;
    MPI_Send(&one, 1, MPI_INT64_T, targets_[t], kTagCredit, comm_);
    return p;
  }

  int pending(const std::vector<int>& targets) override {
    int n = 0;
    for (int t : targets) {
      int flag = 0;
      MPI_Iprobe(targets_[t], kTagHeader, comm_, &flag, MPI_STATUS_IGNORE);
      n += flag;
    }
    return n;
  }

  void finish() override {
    int64_t zero = 0;
    for (int r : targets_) MPI_Send(&zero, 1, MPI_INT64_T, r, kTagStop, comm_);
    const int T = int(targets_.size());
    const std::vector<bool> sends = feature_sources(T, order_.stride, int(order_.next % order_.stride));
    // The batches still coming, in batch order; then the END of each target that sends this drafter nothing.
    std::vector<bool> ended(size_t(T), false);
    int open = int(std::count(sends.begin(), sends.end(), true));
    for (int64_t b = order_.next; open > 0; b += order_.stride) {
      const int t = int(b % T);
      if (ended[size_t(t)]) continue;
      const FeaturePacket p = recv_one(t);
      DF_CHECK(
          (p.hdr.flags & FeatureHeader::kFlagEnd) || p.hdr.batch_id == b,
          "draining target %d (rank %d): expected batch %lld, got batch %lld; HINT: all ranks must run the "
          "same config and data",
          t, targets_[size_t(t)], (long long)b, (long long)p.hdr.batch_id);
      if (p.hdr.flags & FeatureHeader::kFlagEnd) {
        ended[size_t(t)] = true;
        --open;
      }
    }
    for (int t = 0; t < T; ++t)
      if (!sends[size_t(t)]) {
        const FeaturePacket p = recv_one(t);
        DF_CHECK(
            p.hdr.flags & FeatureHeader::kFlagEnd,
            "target %d (rank %d) sent batch %lld to a drafter it has no batches for; HINT: all ranks must "
            "run the same config (topology, pipeline)",
            t, targets_[size_t(t)], (long long)p.hdr.batch_id);
      }
  }

 private:
  FeaturePacket recv_one(int t) {
    FeaturePacket p;
    MPI_Recv(&p.hdr, int(sizeof(FeatureHeader)), MPI_BYTE, targets_[t], kTagHeader, comm_, MPI_STATUS_IGNORE);
    if (p.hdr.flags & FeatureHeader::kFlagEnd) return p;
    const size_t n = payload_bytes(p.hdr);
    DF_CHECK(n <= pool_.bytes(), "target %d (rank %d) sent a batch of %lld tokens (%zu payload bytes) but this "
             "drafter's wire slots hold %zu; HINT: all ranks must run the same data.token_budget",
             t, targets_[size_t(t)], (long long)p.hdr.tokens, n, pool_.bytes());
    std::vector<char> meta(meta_bytes(p.hdr));
    MPI_Recv(meta.data(), checked_count(meta.size()), MPI_BYTE, targets_[size_t(t)], kTagMeta, comm_,
             MPI_STATUS_IGNORE);
    meta_unpack(meta, p);
    const int slot = next_;
    next_ = (next_ + 1) % pool_.depth();
    wire_->receive(slot, n, targets_[size_t(t)], p.hdr.batch_id);
    wire_->arrived(slot);
    p.slot = pool_.data(slot);
    p.slot_device = pool_.device();
    return p;
  }

  MPI_Comm comm_;
  std::vector<int> targets_;
  DrafterBatches order_;  // .next: the batch this drafter takes next
  WirePool& pool_;
  std::unique_ptr<PayloadWire> wire_;
  int next_ = 0;
};

}  // namespace

std::vector<bool> feature_sources(int num_targets, int num_drafters, int d) {
  DF_CHECK(num_targets >= 1 && num_drafters >= 1 && d >= 0 && d < num_drafters,
           "feature channel: drafter %d of %d with %d targets (internal error)", d, num_drafters,
           num_targets);
  const int g = std::gcd(num_targets, num_drafters);
  std::vector<bool> out(size_t(num_targets), false);
  for (int t = 0; t < num_targets; ++t) out[size_t(t)] = t % g == d % g;
  return out;
}

std::unique_ptr<FeatureSender> feature_sender(MPI_Comm comm, std::vector<int> drafters, int depth,
                                              WirePool& pool, std::unique_ptr<PayloadWire> wire) {
  return std::make_unique<ChannelSender>(comm, std::move(drafters), depth, pool, std::move(wire));
}

std::unique_ptr<FeatureReceiver> feature_receiver(MPI_Comm comm, std::vector<int> targets,
                                                  DrafterBatches order, WirePool& pool,
                                                  std::unique_ptr<PayloadWire> wire) {
  return std::make_unique<ChannelReceiver>(comm, std::move(targets), order, pool, std::move(wire));
}

std::unique_ptr<PayloadWire> payload_wire_mpi(MPI_Comm comm, WirePool& pool) {
  return std::make_unique<MpiWire>(comm, pool);
}

std::unique_ptr<FeatureSender> feature_sender_mpi(MPI_Comm comm, std::vector<int> drafters, int depth,
                                                  WirePool& pool) {
  return feature_sender(comm, std::move(drafters), depth, pool, payload_wire_mpi(comm, pool));
}

std::unique_ptr<FeatureReceiver> feature_receiver_mpi(MPI_Comm comm, std::vector<int> targets,
                                                      DrafterBatches order, WirePool& pool) {
  return feature_receiver(comm, std::move(targets), order, pool, payload_wire_mpi(comm, pool));
}

std::unique_ptr<PayloadWire> payload_wire(MPI_Comm comm, NcclComm* nccl, WirePool& pool) {
#ifdef DF_HAVE_CUDA
  if (nccl) return payload_wire_nccl(*nccl, pool);
#endif
  DF_CHECK(!nccl, "feature payloads over NCCL in a build without CUDA (internal error)");
  return payload_wire_mpi(comm, pool);
}

}  // namespace df
