// The feature channel over MPI point-to-point. Sends are non-blocking and kept alive until complete; every
// wait is a polling loop that also watches for STOP, so a target never blocks in a call the drafters will
// not answer.
#include <mpi.h>

#include <cstring>
#include <thread>

#include "core/error.h"
#include "dist/feature_channel.h"

namespace df {

namespace {

enum Tag : int { kTagHeader = 101, kTagPayload = 102, kTagCredit = 103, kTagStop = 104 };

size_t align8(size_t n) { return (n + 7) / 8 * 8; }

size_t payload_bytes(const FeatureHeader& h) {
  size_t T = size_t(h.tokens);
  return align8(8 * (h.num_seqs + 1)) + align8(4 * T) + align8(T) + 2 * T * h.feat_cols + 2 * T * h.final_cols;
}

std::vector<char> payload_pack(const FeaturePacket& p) {
  const FeatureHeader& h = p.hdr;
  std::vector<char> buf(payload_bytes(h));
  char* w = buf.data();
  auto put = [&](const void* src, size_t n) {
    if (n) std::memcpy(w, src, n);
    w += align8(n);
  };
  put(p.offsets.data(), 8 * p.offsets.size());
  put(p.tokens.data(), 4 * p.tokens.size());
  put(p.loss_mask.data(), p.loss_mask.size());
  put(p.features.data(), 2 * p.features.size());
  put(p.final_hidden.data(), 2 * p.final_hidden.size());
  return buf;
}

void payload_unpack(const std::vector<char>& buf, FeaturePacket& p) {
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
  get(p.features, T * h.feat_cols);
  get(p.final_hidden, T * h.final_cols);
}

int checked_count(size_t bytes) {
  DF_CHECK(bytes <= size_t(INT32_MAX), "feature payload of %zu bytes exceeds MPI's 2 GiB count; HINT: lower "
           "data.token_budget",
           bytes);
  return int(bytes);
}

// Sleep between polls: short enough not to add latency to a CPU pipeline, long enough not to spin a core.
void poll_pause() { std::this_thread::sleep_for(std::chrono::microseconds(200)); }

class MpiSender final : public FeatureSender {
 public:
  MpiSender(MPI_Comm comm, std::vector<int> drafters, int depth)
      : comm_(comm), drafters_(std::move(drafters)), credits_(drafters_.size(), depth),
        stop_seen_(drafters_.size(), false) {}

  bool send(int d, FeaturePacket&& p) override {
    while (credits_[d] == 0) {
      poll();
      if (stopped()) return false;
      if (credits_[d] == 0) poll_pause();
    }
    if (stopped()) return false;
    --credits_[d];
    post(d, std::move(p));
    return true;
  }

  bool stopped() override {
    poll();
    for (bool s : stop_seen_)
      if (!s) return false;
    return true;
  }

  void finish() override {
    while (!stopped()) poll_pause();
    for (size_t d = 0; d < drafters_.size(); ++d) {
      FeaturePacket end;
      end.hdr.flags = FeatureHeader::kFlagEnd;
      post(int(d), std::move(end));
    }
    for (auto& f : inflight_) MPI_Waitall(2, f->req, MPI_STATUSES_IGNORE);
    inflight_.clear();
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
    FeatureHeader hdr;
    std::vector<char> payload;
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  };

  void post(int d, FeaturePacket&& p) {
    auto f = std::make_unique<Inflight>();
    f->hdr = p.hdr;
    f->payload = payload_pack(p);
    const int dst = drafters_[d];
    MPI_Isend(&f->hdr, int(sizeof(FeatureHeader)), MPI_BYTE, dst, kTagHeader, comm_, &f->req[0]);
    if (!(f->hdr.flags & FeatureHeader::kFlagEnd))
      MPI_Isend(f->payload.data(), checked_count(f->payload.size()), MPI_BYTE, dst, kTagPayload, comm_, &f->req[1]);
    inflight_.push_back(std::move(f));  // heap-held: MPI keeps pointers into hdr and payload
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
    // Retire completed sends in order (the buffers must live until MPI is done with them).
    while (!inflight_.empty()) {
      int done = 0;
      MPI_Testall(2, inflight_.front()->req, &done, MPI_STATUSES_IGNORE);
      if (!done) break;
      inflight_.pop_front();
    }
  }

  MPI_Comm comm_;
  std::vector<int> drafters_;
  std::vector<int> credits_;
  std::vector<bool> stop_seen_;
  std::deque<std::unique_ptr<Inflight>> inflight_;
};

class MpiReceiver final : public FeatureReceiver {
 public:
  // The sender starts with `depth` credits per drafter, so the receiver has nothing to announce.
  MpiReceiver(MPI_Comm comm, std::vector<int> targets) : comm_(comm), targets_(std::move(targets)) {}

  FeaturePacket recv(int t) override {
    FeaturePacket p = recv_one(t);
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
    for (size_t t = 0; t < targets_.size(); ++t)
      while (!(recv_one(int(t)).hdr.flags & FeatureHeader::kFlagEnd)) {
      }
  }

 private:
  FeaturePacket recv_one(int t) {
    FeaturePacket p;
    MPI_Recv(&p.hdr, int(sizeof(FeatureHeader)), MPI_BYTE, targets_[t], kTagHeader, comm_, MPI_STATUS_IGNORE);
    if (p.hdr.flags & FeatureHeader::kFlagEnd) return p;
    std::vector<char> buf(payload_bytes(p.hdr));
    MPI_Recv(buf.data(), checked_count(buf.size()), MPI_BYTE, targets_[t], kTagPayload, comm_, MPI_STATUS_IGNORE);
    payload_unpack(buf, p);
    return p;
  }

  MPI_Comm comm_;
  std::vector<int> targets_;
};

}  // namespace

std::unique_ptr<FeatureSender> feature_sender_mpi(MPI_Comm comm, std::vector<int> drafters, int depth) {
  return std::make_unique<MpiSender>(comm, std::move(drafters), depth);
}

std::unique_ptr<FeatureReceiver> feature_receiver_mpi(MPI_Comm comm, std::vector<int> targets) {
  return std::make_unique<MpiReceiver>(comm, std::move(targets));
}

}  // namespace df
