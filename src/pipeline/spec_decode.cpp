// Speculative decoding: prefill, then draft a block from the context features, verify it with one target
// step, commit the accepted prefix and the target's bonus token, and grow the context by the accepted
// positions' taps. The committed tokens are the target's greedy decoding whatever the drafter proposes.
#include "pipeline/spec_decode.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/clock.h"
#include "core/error.h"

namespace df {

DrafterBatch draft_batch(const std::vector<int32_t>& committed, const Tensor& ctx, int block) {
  const int64_t anchor = int64_t(committed.size()) - 1, len = anchor + block;
  DF_CHECK(anchor >= 0 && ctx.rows >= len,
           "draft: %zu committed tokens need %lld context rows, the buffer has %lld", committed.size(),
           (long long)len, (long long)ctx.rows);
  // The placeholders only make the block rows labelled (the loss op scores, hence argmaxes, only those); the
  // block sees context positions < anchor, so neither they nor the scratch rows of ctx reach the drafts.
  DrafterBatch b;
  b.offsets = {0, len};
  b.tokens = committed;
  b.tokens.resize(size_t(len), 0);
  b.loss_mask.assign(size_t(len), 1);
  b.taps = ctx.rows_view(0, len);
  return b;
}

DrafterAnchor draft_anchor(const std::vector<int32_t>& committed) {
  return DrafterAnchor{0, int32_t(committed.size()) - 1};
}

DFlashBlockDrafter::DFlashBlockDrafter(DrafterModel& model, double confidence_threshold)
    : m_(model), confidence_threshold_(confidence_threshold) {
  DF_CHECK(confidence_threshold >= 0 && confidence_threshold <= 1,
           "speculative decoding: the confidence threshold %g must be in [0, 1]", confidence_threshold);
  DF_CHECK(
      confidence_threshold == 0 ||
          (model.config().kind == DrafterKind::dspark && model.config().enable_confidence_head),
      "speculative decoding: a confidence-based verify length needs a DSpark drafter with a confidence head "
      "(drafter.kind = \"dspark\", enable_confidence_head), this one is a %s drafter%s; HINT: drop "
      "--dspark-confidence",
      drafter_kind_name(model.config().kind),
      model.config().kind == DrafterKind::dspark ? " without one" : "");
}

std::vector<int32_t> DFlashBlockDrafter::draft(const std::vector<int32_t>& committed, const Tensor& ctx) {
  const DrafterConfig& c = m_.config();
  const int B = c.block_size;
  if (m_.workspace == nullptr) {
    // Planned once, for the context buffer's rows (every draft's sequence fits it) and one block.
    DrafterLimits lim;
    lim.max_tokens = ctx.rows;
    lim.max_blocks = 1;
    drafter_plan_workspace(m_, lim);
  }
  const DrafterBatch b = draft_batch(committed, ctx, B);
  DrafterLossOptions o;
  o.backward = false;
  // No target distribution exists at inference: DSpark's L1 and confidence terms are off (the forward and
  // the proposals do not read them).
  o.dspark.l1 = 0;
  o.dspark.confidence = 0;
  const std::vector<DrafterAnchor> block{draft_anchor(committed)};
  const LossStats st = drafter_forward_backward(m_, b, block, o);
  // Domino proposes token by token, its GRU reading its own earlier proposals (not the argmax of the
  // teacher-forced rows the step scored).
  if (c.kind == DrafterKind::domino) return drafter_domino_drafts(m_, b, block, o);
  // DFlash2 walks the selector's lattice over each slot's top-K from the last committed token.
  if (c.kind == DrafterKind::dflash2) return drafter_dflash2_drafts(m_, b, block, o);
  if (c.kind == DrafterKind::dspark) {
    std::vector<double> conf;
    std::vector<int32_t> drafts =
        drafter_dspark_drafts(m_, b, block, o, confidence_threshold_ > 0 ? &conf : nullptr);
    if (confidence_threshold_ > 0) {
      size_t n = 0;
      double survive = 1;
      while (n < drafts.size() && (survive /= 1.0 + std::exp(-conf[n])) >= confidence_threshold_) ++n;
      drafts.resize(n);
    }
    return drafts;
  }
  DF_CHECK(int64_t(st.row_argmax.size()) == B, "draft: the drafter step returned %zu rows for a block of %d",
           st.row_argmax.size(), B);
  return std::vector<int32_t>(st.row_argmax.begin() + 1, st.row_argmax.end());
}

double SpecPromptResult::tau() const {
  if (accept_lengths.empty()) return 0.0;
  return double(std::accumulate(accept_lengths.begin(), accept_lengths.end(), int64_t(0))) /
         double(accept_lengths.size());
}

SpecDecoder::SpecDecoder(const TargetModel& target, BlockDrafter& drafter, int64_t max_prompt,
                         int64_t max_new)
    : target_(target), drafter_(drafter), max_new_(max_new) {
  const int B = drafter_.block_size();
  DF_CHECK(max_prompt >= 1 && max_new >= 1,
           "speculative decoding: max prompt %lld and max new tokens %lld must be ≥ 1", (long long)max_prompt,
           (long long)max_new);
  const int64_t max_len = max_prompt + max_new + B;
  dec_ = std::make_unique<TargetDecoder>(
      target_, TargetDecodeLimits{max_len, std::max<int64_t>(max_prompt, B), B}, drafter_.target_layer_ids());
  Ops& ops = *target_.ops;
  const int64_t rows = max_len + B,
                cols = int64_t(target_.cfg.hidden) * int64_t(drafter_.target_layer_ids().size());
  Arena arena;
  // In the target's activation dtype (f32 on the CPU, bf16 on CUDA): the drafter on the same device trains in it.
  ctx_block_ =
      ops_alloc_planned(ops, [&](Arena& a) { ctx_ = a.alloc(ops.act_dtype(), rows, cols); }, 0, arena);
  const std::vector<float> zeros(size_t(rows * cols), 0.0f);  // scratch rows are read by the drafter's fc
  ops.upload_f32(ctx_, zeros.data());
}

SpecDecoder::~SpecDecoder() {
  if (ctx_block_) target_.ops->free_bytes(ctx_block_);
}

void SpecDecoder::append_context(int64_t start, int64_t n) {
  const int64_t H = target_.cfg.hidden;
  for (size_t i = 0; i < dec_->tap_layers().size(); ++i)
    target_.ops->copy(dec_->tap(i).rows_view(0, n), ctx_.rows_view(start, n).cols_view(int64_t(i) * H, H));
  // The drafter reads ctx_ next, on its own backend's stream.
  target_.ops->synchronize();
}

SpecPromptResult SpecDecoder::run(const std::vector<int32_t>& prompt, const std::vector<int32_t>& stop) {
  const int B = drafter_.block_size();
  const int64_t P = int64_t(prompt.size());
  SpecPromptResult r;
  auto t0 = std::chrono::steady_clock::now();
  dec_->reset();
  dec_->step(prompt);
  dec_->commit(P);
  append_context(0, P);
  std::vector<int32_t> committed = prompt;
  committed.push_back(dec_->argmax_rows().back());
  r.prefill_s = seconds_since(t0);
  // The first stop token among committed[from..), or committed.size(): the generation ends with it.
  auto stop_at = [&](size_t from) {
    for (size_t i = from; i < committed.size(); ++i)
      if (std::find(stop.begin(), stop.end(), committed[i]) != stop.end()) return i;
    return committed.size();
  };
  size_t end = stop_at(size_t(P));
  while (end == committed.size() && int64_t(committed.size()) - P < max_new_) {
    const size_t before = committed.size();
    t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> drafts = drafter_.draft(committed, ctx_);
    DF_CHECK(int(drafts.size()) <= B - 1,
             "speculative decoding: the drafter proposed %zu tokens, more than B − 1 = %d", drafts.size(),
             B - 1);
    const int proposed = int(drafts.size());
    r.draft_s += seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> block{committed.back()};
    block.insert(block.end(), drafts.begin(), drafts.end());
    const int64_t start = dec_->length();
    dec_->step(block);
    const std::vector<int32_t> posterior = dec_->argmax_rows();  // the target's next token after each one
    int acc = 0;
    while (acc < proposed && block[size_t(acc) + 1] == posterior[size_t(acc)]) ++acc;
    dec_->commit(acc + 1);
    append_context(start, acc + 1);
    committed.insert(committed.end(), block.begin() + 1, block.begin() + 1 + acc);
    committed.push_back(posterior[size_t(acc)]);
    r.accept_lengths.push_back(acc + 1);
    r.verified += proposed;
    r.verify_s += seconds_since(t0);
    end = stop_at(before);
  }
  end = std::min({end + 1, committed.size(), size_t(P + max_new_)});
  r.tokens.assign(committed.begin() + P, committed.begin() + int64_t(end));
  return r;
}

int32_t sample_token(const float* logits, int64_t vocab, const SampleOptions& o, Rng& rng) {
  if (o.temperature <= 0) return int32_t(std::max_element(logits, logits + vocab) - logits);
  DF_CHECK(o.top_p > 0 && o.top_p <= 1, "top_p %g must be in (0, 1]", double(o.top_p));
  const double mx = *std::max_element(logits, logits + vocab);
  std::vector<double> p(static_cast<size_t>(vocab));
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v)
    sum += p[size_t(v)] = std::exp((double(logits[v]) - mx) / o.temperature);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  // Most likely first, ties by id, so the kept set and the draw do not depend on the sort's stability.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
  });
  size_t keep = 0;
  double kept = 0;
  while (keep < order.size() && (keep == 0 || kept < o.top_p * sum)) kept += p[size_t(order[keep++])];
  double u = rng.uniform() * kept;
  for (size_t i = 0; i < keep; ++i) {
    u -= p[size_t(order[i])];
    if (u < 0) return order[i];
  }
  return order[keep - 1];
}

std::vector<std::vector<int32_t>> target_generate(TargetDecoder& dec,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  int64_t max_new, const SampleOptions& o,
                                                  std::vector<Rng>& rngs) {
  const int64_t V = dec.vocab();
  const size_t n = prompts.size();
  DF_CHECK(n >= 1 && int(n) <= dec.slots() && rngs.size() == n && max_new >= 1,
           "target_generate: %zu prompts, %zu generators, %lld new tokens for a decoder of %d slots", n,
           rngs.size(), (long long)max_new, dec.slots());
  dec.reset();
  std::vector<std::vector<int32_t>> out(n);
  std::vector<int32_t> next(size_t(dec.slots()), 0);  // placeholder token for slots without a prompt
  std::vector<uint8_t> done(n, 0);                    // ended with a stop token: its slot idles
  size_t running = n;
  auto take = [&](size_t i, const float* logits) {
    next[i] = sample_token(logits, V, o, rngs[i]);
    out[i].push_back(next[i]);
    if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), next[i]) != o.stop_tokens.end()) {
      done[i] = 1;
      --running;
    }
  };
  for (size_t i = 0; i < n; ++i) {
    dec.step(prompts[i], int(i));
    dec.commit(int64_t(prompts[i].size()));
    const std::vector<float> lg = dec.logits_host();
    take(i, &lg[lg.size() - size_t(V)]);
  }
  for (int64_t t = 1; t < max_new && running > 0; ++t) {
    dec.step_all(next);
    const std::vector<float> lg = dec.logits_host();  // row s: slot s
    for (size_t i = 0; i < n; ++i)
      if (!done[i]) take(i, &lg[i * size_t(V)]);
  }
  return out;
}

void SpecSummary::add(const SpecPromptResult& r, int block) {
  if (accept_hist.size() < size_t(block) + 1) accept_hist.resize(size_t(block) + 1, 0);
  prompts += 1;
  blocks += int64_t(r.accept_lengths.size());
  new_tokens += int64_t(r.tokens.size());
  verified += r.verified;
  tau_sum += r.tau();
  for (int a : r.accept_lengths) accept_hist[size_t(a)] += 1;
  draft_s += r.draft_s;
  verify_s += r.verify_s;
  prefill_s += r.prefill_s;
}

}  // namespace df
