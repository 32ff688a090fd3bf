// Greedy speculative decoding with a block drafter against the target (MODELS.md "Speculative decoding with a
// DFlash drafter"), plain decoding of the target (greedy or temperature / top-p, seeded) for `eval
// --generate`, and the acceptance statistics `dflash_mpi eval` prints. One prompt at a time, as z-lab's
// dflash_generate.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "model/drafter.h"
#include "model/target_decode.h"

namespace df {

// What proposes the B − 1 tokens after the last committed one.
class BlockDrafter {
 public:
  virtual ~BlockDrafter() = default;
  virtual int block_size() const = 0;
  // Target layers whose outputs, concatenated in this order, are the drafter's context features.
  virtual const std::vector<int>& target_layer_ids() const = 0;
  // committed: every token so far (prompt and generated), its last one not yet run through the target.
  // ctx: [≥ committed.size() − 1 + block_size(), k·H]; row t < committed.size() − 1 holds the taps of
  // position t, the rows after it are scratch. Returns up to block_size() − 1 draft tokens: fewer when the
  // drafter chooses to have only a prefix of its proposals verified.
  virtual std::vector<int32_t> draft(const std::vector<int32_t>& committed, const Tensor& ctx) = 0;
};

// What a draft runs the drafter step on: one sequence of the committed tokens plus block − 1 placeholders
// over the first rows of ctx, and its one block anchored at the last committed token.
DrafterBatch draft_batch(const std::vector<int32_t>& committed, const Tensor& ctx, int block);
DrafterAnchor draft_anchor(const std::vector<int32_t>& committed);

// The drafter's inference forward (any drafter.kind): the training step's forward with backward off, one
// block anchored at the last committed token (it sees every earlier position as context, as at inference in
// DFlash); DFlash drafts the argmax of every slot, Domino its GRU-corrected greedy proposals
// (drafter_domino_drafts), DSpark its Markov-biased greedy proposals (drafter_dspark_drafts). The first draft
// plans the model's workspace for the context buffer it is given (a model without one).
//
// confidence_threshold (DSpark with a confidence head only; 0: off): the block is cut to the leading
// proposals whose predicted prefix survival Π_{j≤p} σ(confidence_j), the confidence head's estimate that the
// target accepts proposals 1..p, stays ≥ the threshold, so the target verifies fewer tokens where the drafter
// expects a rejection (DSpark's confidence-based verify length). The committed tokens stay the target's
// greedy ones; τ can only fall, the verified tokens per block fall with it.
class DFlashBlockDrafter final : public BlockDrafter {
 public:
  explicit DFlashBlockDrafter(DrafterModel& model, double confidence_threshold = 0);
  int block_size() const override { return m_.config().block_size; }
  const std::vector<int>& target_layer_ids() const override { return m_.config().target_layer_ids; }
  std::vector<int32_t> draft(const std::vector<int32_t>& committed, const Tensor& ctx) override;

 private:
  DrafterModel& m_;
  double confidence_threshold_;
};

struct SpecPromptResult {
  std::vector<int32_t> tokens;  // the generated tokens: max_new_tokens, or fewer ending in a stop token
  std::vector<int> accept_lengths;  // per verified block: acc + 1 (its committed tokens, bonus included)
  int64_t verified = 0;             // draft tokens the target verified, over all blocks
  double draft_s = 0, verify_s = 0, prefill_s = 0;
  double tau() const;  // mean of accept_lengths
};

class SpecDecoder {
 public:
  // max_prompt: the longest prompt to come; max_new: tokens generated per prompt.
  SpecDecoder(const TargetModel& target, BlockDrafter& drafter, int64_t max_prompt, int64_t max_new);
  ~SpecDecoder();
  SpecDecoder(const SpecDecoder&) = delete;
  SpecDecoder& operator=(const SpecDecoder&) = delete;
  // Decodes until max_new tokens or, after a block, until one of `stop` (e.g. the chat template's end of
  // turn) has been committed; the tokens end with it.
  SpecPromptResult run(const std::vector<int32_t>& prompt, const std::vector<int32_t>& stop = {});

 private:
  void append_context(int64_t start,
                      int64_t n);  // taps of the last step's first n rows at rows [start, start+n)

  const TargetModel& target_;
  BlockDrafter& drafter_;
  int64_t max_new_;
  std::unique_ptr<TargetDecoder> dec_;
  Tensor ctx_;  // [max_len + B, k·H] context features
  void* ctx_block_ = nullptr;
};

struct SampleOptions {
  float temperature = 0;  // 0: greedy (argmax, ties → lowest id)
  float top_p = 1;        // nucleus: the smallest set of most likely tokens whose probability reaches top_p
  uint64_t seed = 0;      // with the prompt index, seeds each prompt's own core/rng.h stream
  std::vector<int32_t> stop_tokens;  // a continuation ends with the first of these it produces
};

// The next token from one row of logits (host, V floats); rng is used only when temperature > 0.
int32_t sample_token(const float* logits, int64_t vocab, const SampleOptions& o, Rng& rng);

// The target's own continuations (max_new tokens each, or fewer ending in one of o.stop_tokens) of up to
// dec's slots prompts, decoded side by side: each prompt is prefilled in its slot, then every step decodes
// one token of every slot (TargetDecoder::step_all; slots without a prompt run on a placeholder and are
// dropped). rngs[i] draws prompt i's tokens. dec: planned with max_step ≥ the longest prompt and max_len ≥
// prompt + max_new.
std::vector<std::vector<int32_t>> target_generate(TargetDecoder& dec,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  int64_t max_new, const SampleOptions& o,
                                                  std::vector<Rng>& rngs);

// Totals over prompts for the summary line.
struct SpecSummary {
  int64_t prompts = 0, blocks = 0, new_tokens = 0, verified = 0;
  double tau_sum = 0;                // Σ over prompts of the prompt's τ
  std::vector<int64_t> accept_hist;  // [B + 1]: blocks by acceptance length 1..B
  double draft_s = 0, verify_s = 0, prefill_s = 0;
  void add(const SpecPromptResult& r, int block);
  double tau() const { return prompts > 0 ? tau_sum / double(prompts) : 0.0; }
};

}  // namespace df
