// Incremental decoding of the target for speculative decoding and generation (MODELS.md "Speculative decoding
// with a DFlash drafter"): one sequence, a KV cache for the attention layers and the DeltaNet recurrent +
// conv state, steps of a few tokens whose effect can be rolled back to any accepted prefix.
//
//   TargetDecoder dec(model, {max_len, max_step, max_block}, tap_layers);
//   dec.step(prompt);   dec.commit(prompt.size());           // prefill: logits of the last row, taps of all
//   rows dec.step(block);    dec.commit(accepted + 1);            // verify B tokens, keep the accepted
//   prefix
//
// A step is tentative until commit(n) keeps its first n tokens; the attention caches are cropped by moving
// the length, the DeltaNet layers restore the recurrent state and conv history saved after token n.
// Everything runs through Ops, so a backend that implements attention_cached and gdn_decode runs it
// unchanged.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/target.h"

namespace df {

struct TargetDecodeLimits {
  int64_t max_len = 0;    // tokens the caches hold (prompt + generated + one block of look-ahead)
  int64_t max_step = 0;   // tokens one step takes (the longest prompt; prefill is one step)
  int64_t max_block = 0;  // a step can be rolled back within its last max_block tokens; logits exist for them
  int slots = 1;          // sequences decoded side by side (step_all); slots ≤ max_step
};

class TargetDecoder {
 public:
  // The model must hold every layer and its lm_head (TargetLoadOptions::need_lm_head). tap_layers: decoder
  // layers whose outputs each step returns (the drafter's target_layer_ids).
  TargetDecoder(const TargetModel& model, const TargetDecodeLimits& limits,
                const std::vector<int>& tap_layers);
  ~TargetDecoder();
  TargetDecoder(const TargetDecoder&) = delete;
  TargetDecoder& operator=(const TargetDecoder&) = delete;

  // Empties the caches of every slot.
  void reset();
  // Runs ids (host, each < vocab) of one slot at positions length(slot) .. length(slot) + n − 1. The previous
  // step must have been committed. Afterwards logits() holds the last min(n, max_block) rows and tap(i) all
  // n.
  void step(const std::vector<int32_t>& ids, int slot = 0);
  // Keeps the first n tokens of the last step (0 ≤ n ≤ its size; n = 0 or n > size − min(size, max_block)).
  void commit(int64_t n);
  // One token per slot (ids[s] for slot s, all slots), committed at once (no rollback); logits() row s and
  // tap(i) row s belong to slot s.
  void step_all(const std::vector<int32_t>& ids);

  int64_t length(int slot = 0) const { return lens_[size_t(slot)]; }  // committed tokens
  int vocab() const { return m_.cfg.vocab; }
  int slots() const { return lim_.slots; }
  // f32/act [rows, V] logits of the last step's last rows (row r = token size − rows + r).
  Tensor logits() const;
  // act [n, H]: output of decoder layer tap_layers[i] for the last step's tokens.
  Tensor tap(size_t i) const;
  const std::vector<int>& tap_layers() const { return tap_layers_; }
  // logits() on the host, row-major.
  std::vector<float> logits_host();
  // The argmax of each logits() row (ties → lowest id, as greedy decoding in transformers).
  std::vector<int32_t> argmax_rows();

 private:
  struct Buffers;
  struct LayerCache;
  // Rows [row0, row0 + n) of a step belong to `slot`, whose caches hold `past` tokens before them.
  struct Segment {
    int slot = 0;
    int64_t row0 = 0, n = 0, past = 0;
  };
  void plan(Arena& a);
  void forward(const std::vector<int32_t>& ids, const std::vector<int32_t>& pos, int64_t R);
  void layer_full(size_t l, int64_t T);
  void layer_linear(size_t l, int64_t T, int64_t R);

  const TargetModel& m_;
  Ops& ops_;
  TargetDecodeLimits lim_;
  std::vector<int> tap_layers_;
  std::unique_ptr<Buffers> b_;
  std::vector<LayerCache> caches_;
  void* block_ = nullptr;
  std::vector<int64_t> lens_;  // committed tokens per slot
  std::vector<Segment> segs_;  // the running step's rows
  bool batched_ = false;       // the running step is step_all (no rollback: caches updated in place)
  int64_t pending_ = -1;       // tokens of the uncommitted step, −1 when none
  int pending_slot_ = 0;
  int64_t pending_saved_ = 0;  // how many of its last tokens have saved DeltaNet states and logits
  int64_t last_step_ = 0;      // tokens of the last step run (committed or not)
  int32_t conv_cu_rows_ = -1;  // what b_->conv_cu holds ({0, rows}); uploading is a stream sync, so only on change
};

}  // namespace df
