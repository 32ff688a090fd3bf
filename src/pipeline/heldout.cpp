// HeldoutEval: feature-file batches through the drafter's forward (drafter_forward_backward with backward
// off).
#include "pipeline/heldout.h"

#include <algorithm>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "train/anchors.h"

namespace df {

namespace {

std::vector<float> to_f32(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(), [](uint16_t h) { return bf16_to_f32(h); });
  return out;
}

}  // namespace

HeldoutEval::HeldoutEval(const Config& cfg, const DrafterConfig& drafter)
    : dc_(drafter), kl_(cfg.train.loss == "kl") {
  const int64_t budget = cfg.data.token_budget, limit = cfg.eval.max_sequences;
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
    DF_CHECK(!kl_ || reader->has_final_norm(),
             "eval.data %s has no final_norm, which the soft-KL loss (train.loss = \"kl\") needs; HINT: "
             "dflash_mpi extract --for-config writes it",
             path.c_str());
    TokenData td = token_file_read(path);
    const size_t file = readers_.size();
    int64_t s = 0;
    while (s < td.num_sequences() && (limit == 0 || sequences_ < limit)) {
      Batch b{file, s, 0};
      int64_t tokens = 0;
      while (s < td.num_sequences() && (limit == 0 || sequences_ < limit) &&
             (b.num_seqs == 0 || tokens + td.sequence_length(s) <= budget)) {
        tokens += td.sequence_length(s++);
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

LossStats HeldoutEval::run(DrafterModel& m, const DrafterLossOptions& opts) {
  DrafterLossOptions o = opts;
  o.backward = false;
  o.noise_std = 0;  // evaluation sees the features as they are
  const int64_t H = dc_.hidden, k = dc_.num_taps();
  LossStats total;
  for (size_t i = 0; i < batches_.size(); ++i) {
    const Batch& b = batches_[i];
    const TokenData& td = tokens_[b.file];
    const int64_t row0 = td.offsets[size_t(b.first_seq)], row1 = td.offsets[size_t(b.first_seq + b.num_seqs)];
    const int64_t T = row1 - row0;
    DrafterBatch db;
    for (int64_t s = b.first_seq; s <= b.first_seq + b.num_seqs; ++s)
      db.offsets.push_back(td.offsets[size_t(s)] - row0);
    db.tokens.assign(td.tokens.begin() + row0, td.tokens.begin() + row1);
    if (td.loss_mask.empty())
      db.loss_mask.assign(size_t(T), 1);
    else
      db.loss_mask.assign(td.loss_mask.begin() + row0, td.loss_mask.begin() + row1);
    std::vector<uint16_t> raw(size_t(T * k * H));
    readers_[b.file]->read_taps(dc_.target_layer_ids, row0, T, raw.data(), k * H);
    std::vector<float> taps = to_f32(raw), hidden;
    db.taps = tensor_make(taps.data(), DType::f32, Device::cpu, T, k * H);
    if (kl_) {
      std::vector<uint16_t> fn(size_t(T * H));
      readers_[b.file]->read_final_norm(row0, T, fn.data(), H);
      hidden = to_f32(fn);
      db.target_hidden = tensor_make(hidden.data(), DType::f32, Device::cpu, T, H);
    }
    // A fixed stream per batch: every evaluation scores the same blocks.
    Rng rng(rng_mix(0x4e1d0e7ull, uint64_t(i)));
    total.merge(drafter_forward_backward(m, db, anchors_sample_batch(db, dc_.num_anchors, rng), o));
  }
  return total;
}

}  // namespace df
