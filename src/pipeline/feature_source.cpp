// The offline feature source; see feature_source.h.
#include "pipeline/feature_source.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "core/bounded_queue.h"
#include "core/clock.h"
#include "data/feature_file.h"
#include "data/prefetcher.h"

namespace df {

namespace {

class FileFeatureReceiver final : public FeatureReceiver {
 public:
  FileFeatureReceiver(const TrainPlan& plan, int drafter)
      : plan_(plan), queue_(size_t(std::max(1, plan.cfg.data.prefetch_depth))) {
    for (size_t i = 0; i < plan.corpus->num_files(); ++i)
      readers_.push_back(std::make_unique<FeatureFileReader>(plan.corpus->file_path(i)));
    for (int64_t step = plan.start_step; step < plan.total_steps; ++step)
      for (int a = 0; a < plan.grad_accum; ++a) indices_.push_back(plan.batch_of(step, a, drafter));
    thread_ = std::thread([this] { run(); });
  }
  ~FileFeatureReceiver() override { finish(); }

  FeaturePacket recv(int) override {
    std::optional<FeaturePacket> p = queue_.pop();
    DF_CHECK(p.has_value(), "offline features: asked for more batches than the run's %zu", indices_.size());
    return std::move(*p);
  }
  int pending(const std::vector<int>&) override { return int(queue_.size()); }
  void finish() override {
    stop_ = true;
    queue_.close();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    try {
      const std::vector<int>& taps = plan_.drafter.target_layer_ids;
      const int64_t H = plan_.target.hidden, cols = H * int64_t(taps.size());
      for (int64_t b : indices_) {
        if (stop_) return;
        auto t0 = std::chrono::steady_clock::now();
        const Batch batch = plan_.batcher->batch_at(b);
        MaterialisedBatch mb = batch_materialise(*plan_.corpus, batch);
        FeaturePacket p;
        p.hdr.batch_id = b;
        p.hdr.epoch = batch.epoch;
        p.hdr.num_seqs = int64_t(batch.items.size());
        p.hdr.tokens = int64_t(mb.tokens.size());
        p.hdr.feat_cols = cols;
        p.hdr.final_cols = plan_.final_hidden ? H : 0;
        p.features.resize(size_t(p.hdr.tokens * cols));
        if (plan_.final_hidden) p.final_hidden.resize(size_t(p.hdr.tokens * H));
        for (size_t i = 0; i < batch.items.size(); ++i) {
          const BatchItem& it = batch.items[i];
          const TokenCorpus::Location at = plan_.corpus->locate(it.seq);
          const FeatureFileReader& rd = *readers_[at.file];
          const int64_t row = mb.offsets[i];
          rd.read_taps(taps, at.row + it.start, it.length, p.features.data() + row * cols, cols);
          if (plan_.final_hidden)
            rd.read_final_norm(at.row + it.start, it.length, p.final_hidden.data() + row * H, H);
        }
        p.offsets = std::move(mb.offsets);
        p.tokens = std::move(mb.tokens);
        p.loss_mask = std::move(mb.loss_mask);
        p.hdr.target_busy_s = seconds_since(t0);
        p.hdr.q_pre = int64_t(queue_.size());
        if (!queue_.push(std::move(p))) return;
      }
    } catch (...) {
      queue_.fail(std::current_exception());
    }
  }

  const TrainPlan& plan_;
  std::vector<std::unique_ptr<FeatureFileReader>> readers_;
  std::vector<int64_t> indices_;
  BoundedQueue<FeaturePacket> queue_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

std::unique_ptr<FeatureReceiver> feature_receiver_files(const TrainPlan& plan, int drafter_index) {
  return std::make_unique<FileFeatureReceiver>(plan, drafter_index);
}

}  // namespace df
