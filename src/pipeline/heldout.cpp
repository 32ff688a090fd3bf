// HeldoutEval: feature-file batches, staged like training batches (pipeline/drafter_memory.h), through the
// drafter's forward (drafter_forward_backward with backward off).
#include "pipeline/heldout.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"
#include "train/anchors.h"

namespace df {

HeldoutEval::HeldoutEval(const Config& cfg, const DrafterConfig& drafter)
    : dc_(drafter), budget_(cfg.data.token_budget), final_hidden_(drafter_streams_final_hidden(cfg)) {
  const int64_t limit = cfg.eval.max_sequences;
  for (const std::string& path : cfg.eval.data) {
    auto reader = std::make_unique<FeatureFileReader>(path);
    DF_CHECK(
        reader->hidden() == dc_.hidden,
        "eval.data %s holds hidden size %lld but the drafter's is %d; HINT: extract the held-out features "
        "with this run's target (dflash_mpi extract --for-config)",
        path.c_str(), (long long)reader->hidden(), dc_.hidden);
    for (int l : dc_.target_layer_ids)
      DF_CHECK(
          std::count(reader->layer_ids().begin(), reader->layer_ids().end(), l) == 1,
          "eval.data %s has no layer_%d, a tap of this drafter; HINT: dflash_mpi extract --for-config <this "
          "run's config> writes exactly the taps it needs",
          path.c_str(), l);
    DF_CHECK(
        !final_hidden_ || reader->has_final_norm(),
        "eval.data %s has no final_norm, which the soft-KL loss (train.loss = \"kl\") and DSpark's L1 and "
        "confidence terms need; HINT: "
        "dflash_mpi extract --for-config writes it",
        path.c_str());
    TokenData td = token_file_read(path);
    const size_t file = readers_.size();
    int64_t s = 0;
    while (s < td.num_sequences() && (limit == 0 || sequences_ < limit)) {
      Batch b{file, s, 0};
      int64_t tokens = 0;
      while (s < td.num_sequences() && (limit == 0 || sequences_ < limit)) {
        const int64_t len = std::min(td.sequence_length(s), budget_);  // cut as the training batcher cuts
        if (b.num_seqs > 0 && tokens + len > budget_) break;
        tokens += len;
        ++s;
        ++b.num_seqs;
        ++sequences_;
      }
      batches_.push_back(b);
    }
    readers_.push_back(std::move(reader));
    tokens_.push_back(std::move(td));
  }
  DF_CHECK(sequences_ > 0,
           "eval.data holds no sequences; HINT: name feature files with at least one sequence");
}

HeldoutEval::~HeldoutEval() = default;

LossStats HeldoutEval::run(DrafterModel& m, DrafterMemory& mem, const DrafterLossOptions& opts) {
  DrafterLossOptions o = opts;
  o.backward = false;
  o.noise_std = 0;  // evaluation sees the features as they are
  const int64_t H = dc_.hidden, cols = H * dc_.num_taps();
  LossStats total;
  for (size_t i = 0; i < batches_.size(); ++i) {
    const Batch& b = batches_[i];
    const TokenData& td = tokens_[b.file];
    const FeatureFileReader& rd = *readers_[b.file];
    FeaturePacket p;
    p.hdr.num_seqs = b.num_seqs;
    p.hdr.feat_cols = cols;
    p.hdr.final_cols = final_hidden_ ? H : 0;
    p.offsets.push_back(0);
    for (int64_t s = b.first_seq; s < b.first_seq + b.num_seqs; ++s) {
      const int64_t row0 = td.offsets[size_t(s)], n = std::min(td.sequence_length(s), budget_);
      const int64_t at = p.offsets.back();
      p.offsets.push_back(at + n);
      p.tokens.insert(p.tokens.end(), td.tokens.begin() + row0, td.tokens.begin() + row0 + n);
      if (td.loss_mask.empty())
        p.loss_mask.insert(p.loss_mask.end(), size_t(n), 1);
      else
        p.loss_mask.insert(p.loss_mask.end(), td.loss_mask.begin() + row0, td.loss_mask.begin() + row0 + n);
      p.features.resize(size_t((at + n) * cols));
      rd.read_taps(dc_.target_layer_ids, row0, n, p.features.data() + at * cols, cols);
      if (final_hidden_) {
        p.final_hidden.resize(size_t((at + n) * H));
        rd.read_final_norm(row0, n, p.final_hidden.data() + at * H, H);
      }
    }
    p.hdr.tokens = p.offsets.back();
    const DrafterBatch db = mem.load(p);
    // A fixed stream per batch: every evaluation scores the same blocks.
    Rng rng(rng_mix(0x4e1d0e7ull, uint64_t(i)));
    std::vector<DrafterAnchor> anchors = anchors_sample_batch(db, dc_.num_anchors, rng);
    anchors_cap(anchors, m.limits.max_blocks, rng);
    total.merge(drafter_forward_backward(m, db, anchors, o));
  }
  return total;
}

}  // namespace df
