// Speculative decoding (pipeline/spec_decode.h) on the CPU with random tiny targets of both families: the
// committed tokens equal the target's plain greedy decoding (recomputed with the full forward, independently
// of the decoder) whatever drafts, Domino, DFlash2 and DSpark drafters included, which propose as their heads
// do (DSpark's confidence-based verify length too); a drafter that drafts the greedy tokens gives τ = B, a
// random one τ ≈ 1; and sampling honours temperature, top-p and the seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/cpu_train_ops.h"
#include "pipeline/spec_decode.h"
#include "target_test_util.h"
#include "test_drafter_util.h"

using namespace df;

namespace {

// Greedy decoding by re-running the full forward over the whole sequence for every token.
std::vector<int32_t> greedy_by_full_forward(const TargetModel& m, Ops& ops, std::vector<int32_t> seq, int n) {
  const int64_t V = m.cfg.vocab;
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const FwdResult r = run_model(m, ops, seq, {int32_t(seq.size())}, 0, true);
    const std::vector<float> lg = host_logits(m, ops, r.final_norm);
    const float* last = &lg[lg.size() - size_t(V)];
    out.push_back(int32_t(std::max_element(last, last + V) - last));
    seq.push_back(out.back());
  }
  return out;
}

// Drafts the target's own greedy continuation: every draft must be accepted.
class OracleDrafter final : public BlockDrafter {
 public:
  OracleDrafter(std::vector<int32_t> full, int block, std::vector<int> taps)
      : full_(std::move(full)), block_(block), taps_(std::move(taps)) {}
  int block_size() const override { return block_; }
  const std::vector<int>& target_layer_ids() const override { return taps_; }
  std::vector<int32_t> draft(const std::vector<int32_t>& committed, const Tensor&) override {
    EXPECT_TRUE(std::equal(committed.begin(), committed.end(), full_.begin()))
        << "committed tokens left greedy";
    return std::vector<int32_t>(full_.begin() + int64_t(committed.size()),
                                full_.begin() + int64_t(committed.size()) + block_ - 1);
  }

 private:
  std::vector<int32_t> full_;
  int block_;
  std::vector<int> taps_;
};

class RandomDrafter final : public BlockDrafter {
 public:
  RandomDrafter(int vocab, int block) : vocab_(vocab), block_(block) {}
  int block_size() const override { return block_; }
  const std::vector<int>& target_layer_ids() const override { return taps_; }
  std::vector<int32_t> draft(const std::vector<int32_t>&, const Tensor&) override {
    std::vector<int32_t> d;
    for (int i = 1; i < block_; ++i) d.push_back(int32_t(rng_.below(uint64_t(vocab_))));
    return d;
  }

 private:
  int vocab_, block_;
  std::vector<int> taps_{0};
  Rng rng_{99};
};

// The drafter tests' tiny drafter, sized for the target.
DrafterConfig tiny_drafter(const QwenConfig& t) {
  DrafterConfig c = df::testing::tiny_drafter_config();
  c.hidden = t.hidden;
  c.vocab = t.vocab;
  c.mask_token_id = t.vocab - 1;
  c.target_layer_ids = {0, t.layers - 1};
  return c;
}

// Checks every draft of a drafter with a head against the head oracle's proposals `want(y, last)` over the
// block's final hidden states y, from the last committed token on (a DSpark drafter with a confidence
// threshold: its verify length cut already applied), then hands it on; counts the draft tokens it verifies.
class CheckedDrafter final : public BlockDrafter {
 public:
  using Oracle = std::function<std::vector<int32_t>(const std::vector<float>& y, int32_t last)>;
  CheckedDrafter(DrafterModel& m, Oracle want, double confidence_threshold = 0)
      : m_(m), inner_(m, confidence_threshold), want_(std::move(want)) {}
  int block_size() const override { return inner_.block_size(); }
  const std::vector<int>& target_layer_ids() const override { return inner_.target_layer_ids(); }
  std::vector<int32_t> draft(const std::vector<int32_t>& committed, const Tensor& ctx) override {
    const std::vector<int32_t> drafts = inner_.draft(committed, ctx);
    DrafterLossOptions o;
    o.backward = false;
    const std::vector<float> y =
        drafter_final_hidden(m_, draft_batch(committed, ctx, block_size()), {draft_anchor(committed)}, o);
    EXPECT_EQ(drafts, want_(y, committed.back())) << "draft " << calls;
    ++calls;
    verified += int64_t(drafts.size());
    return drafts;
  }
  int calls = 0;
  int64_t verified = 0;

 private:
  DrafterModel& m_;
  DFlashBlockDrafter inner_;
  Oracle want_;
};

// A tensor of m's parameters, on the host.
float* param_at(DrafterModel& m, const char* name) {
  return m.params.ptr<float>() + m.table().find(name).offset;
}

using SpecDecodeTest = TargetFamilyTest;

}  // namespace

TEST_P(SpecDecodeTest, DFlashDrafterCommitsTheGreedyTokens) {
  CpuOps ops;
  CpuTrainOps tops;
  const QwenConfig c = cfg();
  auto target = target_random(c, 31, ops, with_lm_head());
  DrafterModel drafter(tiny_drafter(c), tops);
  drafter_init_params(drafter, 5);
  drafter.set_frozen(target->embed, target->lm_head);
  DFlashBlockDrafter bd(drafter);
  const std::vector<int32_t> prompt = random_ids(11, c.vocab, 2);
  const int n = 17;
  const std::vector<int32_t> want = greedy_by_full_forward(*target, ops, prompt, n);
  SpecDecoder spec(*target, bd, 16, n);
  const SpecPromptResult r = spec.run(prompt);
  EXPECT_EQ(r.tokens, want);
  int64_t committed = 1;  // the prefill's token
  for (int a : r.accept_lengths) {
    EXPECT_GE(a, 1);
    EXPECT_LE(a, 4);
    committed += a;
  }
  EXPECT_GE(committed, n);
  EXPECT_LT(committed - (r.accept_lengths.empty() ? 0 : r.accept_lengths.back()),
            n);  // no block past the end
  // The same decoder reused for a second prompt starts from empty caches.
  const std::vector<int32_t> p2 = random_ids(5, c.vocab, 7);
  EXPECT_EQ(spec.run(p2).tokens, greedy_by_full_forward(*target, ops, p2, n));
}

TEST_P(SpecDecodeTest, OracleDrafterGivesTauEqualToBlock) {
  CpuOps ops;
  const QwenConfig c = cfg();
  auto target = target_random(c, 32, ops, with_lm_head());
  const std::vector<int32_t> prompt = random_ids(9, c.vocab, 3);
  const int n = 20, B = 5;
  std::vector<int32_t> full = prompt;
  for (int32_t t : greedy_by_full_forward(*target, ops, prompt, n + B)) full.push_back(t);
  OracleDrafter oracle(full, B, {c.layers - 1});
  SpecDecoder spec(*target, oracle, 9, n);
  const SpecPromptResult r = spec.run(prompt);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(full.begin() + 9, full.begin() + 9 + n));
  EXPECT_DOUBLE_EQ(r.tau(), double(B));
  EXPECT_EQ(r.accept_lengths.size(), size_t(4));  // 1 + 4 blocks of 5 ≥ 20 tokens
}

TEST_P(SpecDecodeTest, RandomDrafterGivesTauNearOne) {
  CpuOps ops;
  const QwenConfig c = cfg();
  auto target = target_random(c, 33, ops, with_lm_head());
  const std::vector<int32_t> prompt = random_ids(6, c.vocab, 4);
  const int n = 40;
  RandomDrafter rd(c.vocab, 4);
  SpecDecoder spec(*target, rd, 6, n);
  const SpecPromptResult r = spec.run(prompt);
  EXPECT_EQ(r.tokens, greedy_by_full_forward(*target, ops, prompt, n));
  // A random draft matches with probability ~1/V per position (V ≈ 30 here): τ ≈ 1.03; 1.25 leaves room for
  // a few lucky hits without letting a drafter that is accepted half the time pass.
  EXPECT_GE(r.tau(), 1.0);
  EXPECT_LT(r.tau(), 1.25);
}

TEST_P(SpecDecodeTest, GenerateGreedyAndSeeded) {
  CpuOps ops;
  const QwenConfig c = cfg();
  auto target = target_random(c, 34, ops, with_lm_head());
  const std::vector<int32_t> prompt = random_ids(7, c.vocab, 5);
  TargetDecoder dec(*target, {7 + 12, 7, 1}, {});
  auto gen = [&](const SampleOptions& o, uint64_t seed) {
    std::vector<Rng> rngs{Rng(seed)};
    return target_generate(dec, {prompt}, 12, o, rngs)[0];
  };
  EXPECT_EQ(gen({}, 1), greedy_by_full_forward(*target, ops, prompt, 12));
  const SampleOptions hot{1.5f, 0.9f, 0};
  const std::vector<int32_t> a = gen(hot, 42);
  EXPECT_EQ(a, gen(hot, 42));
  EXPECT_NE(a, gen(hot, 43));
}

TEST_P(SpecDecodeTest, BatchedGenerationEqualsOneAtATime) {
  // Prompts of different lengths side by side, one slot left without a prompt: every continuation equals the
  // target's greedy decoding of its prompt alone, and sampled ones equal their one-at-a-time draws.
  CpuOps ops;
  const QwenConfig c = cfg();
  auto target = target_random(c, 35, ops, with_lm_head());
  const std::vector<std::vector<int32_t>> prompts{random_ids(7, c.vocab, 1), random_ids(3, c.vocab, 2),
                                                  random_ids(11, c.vocab, 3)};
  const int n = 10;
  TargetDecoder batch(*target, {11 + n, 11, 1, 4}, {}), single(*target, {11 + n, 11, 1}, {});
  std::vector<Rng> r3(3, Rng(0));
  const auto greedy = target_generate(batch, prompts, n, {}, r3);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(greedy[i], greedy_by_full_forward(*target, ops, prompts[i], n)) << "prompt " << i;
  const SampleOptions hot{1.2f, 0.95f, 0};
  std::vector<Rng> rb{Rng(5), Rng(6), Rng(7)};
  const auto sampled = target_generate(batch, prompts, n, hot, rb);
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<Rng> one{Rng(5 + i)};
    EXPECT_EQ(sampled[i], target_generate(single, {prompts[i]}, n, hot, one)[0]) << "prompt " << i;
  }
}

TEST_P(SpecDecodeTest, StopTokensEndTheContinuation) {
  // The stop token is the greedy continuation's 6th token: speculative decoding and (batched) generation both
  // end right after it, and a prompt that never meets it runs to max_new.
  CpuOps ops;
  const QwenConfig c = cfg();
  auto target = target_random(c, 36, ops, with_lm_head());
  const std::vector<int32_t> prompt = random_ids(8, c.vocab, 6), other = random_ids(5, c.vocab, 9);
  const int n = 16;
  const std::vector<int32_t> greedy = greedy_by_full_forward(*target, ops, prompt, n);
  const int32_t stop = greedy[5];
  const size_t first = size_t(std::find(greedy.begin(), greedy.end(), stop) - greedy.begin());
  const std::vector<int32_t> want(greedy.begin(), greedy.begin() + int64_t(first) + 1);
  RandomDrafter rd(c.vocab, 4);
  SpecDecoder spec(*target, rd, 8, n);
  EXPECT_EQ(spec.run(prompt, {stop}).tokens, want);
  TargetDecoder dec(*target, {8 + n, 8, 1, 2}, {});
  SampleOptions o;
  o.stop_tokens = {stop};
  std::vector<Rng> rngs(2, Rng(0));
  const auto gen = target_generate(dec, {prompt, other}, n, o, rngs);
  EXPECT_EQ(gen[0], want);
  const std::vector<int32_t> other_greedy = greedy_by_full_forward(*target, ops, other, n);
  const auto it = std::find(other_greedy.begin(), other_greedy.end(), stop);
  EXPECT_EQ(gen[1], std::vector<int32_t>(other_greedy.begin(), it == other_greedy.end() ? it : it + 1));
}

// drafter.kind = "domino" decodes with its own proposals and stays lossless: the committed tokens are the
// target's greedy ones, in both label modes.
TEST_P(SpecDecodeTest, DominoDrafterProposesWithItsHeadAndCommitsTheGreedyTokens) {
  CpuOps ops;
  CpuTrainOps tops;
  const QwenConfig c = cfg();
  auto target = target_random(c, 33, ops, with_lm_head());
  for (bool shift : {true, false}) {
    DrafterConfig dc = tiny_drafter(c);
    dc.kind = DrafterKind::domino;
    dc.pure_draft_prefix_len = 1;
    dc.emb_dim = 7;
    dc.gru_hidden_dim = 5;
    dc.shift_label = shift;
    DrafterModel drafter(dc, tops);
    drafter_init_params(drafter, 6);
    drafter.set_frozen(target->embed, target->lm_head);
    CheckedDrafter bd(drafter, [&](const std::vector<float>& y, int32_t last) {
      return domino_block_propose<float>(
          domino_head_dims(dc),
          {param_at(drafter, "prefix_gru.weight_ih_l0"), param_at(drafter, "prefix_gru.weight_hh_l0"),
           param_at(drafter, "embed_proj.0.weight"), param_at(drafter, "embed_proj.2.weight")},
          drafter.lm_head.ptr<float>(), drafter.embed.ptr<float>(), y.data(), last);
    });
    const std::vector<int32_t> prompt = random_ids(10, c.vocab, 4);
    const int n = 15;
    SpecDecoder spec(*target, bd, 16, n);
    EXPECT_EQ(spec.run(prompt).tokens, greedy_by_full_forward(*target, ops, prompt, n))
        << "shift_label " << shift;
    EXPECT_GE(bd.calls, 4);  // at most B = 4 tokens a block
  }
}

// drafter.kind = "dflash2" decodes with the selector's greedy lattice walk (ops/dflash2_selector.h) over each
// slot's top-K and stays lossless; codebooks far from their N(0, 0.02²) start make the walk leave the
// per-slot argmax at least once.
TEST_P(SpecDecodeTest, Dflash2DrafterWalksTheSelectorLatticeAndCommitsTheGreedyTokens) {
  CpuOps ops;
  CpuTrainOps tops;
  const QwenConfig c = cfg();
  auto target = target_random(c, 34, ops, with_lm_head());
  DrafterConfig dc = tiny_drafter(c);
  dc.kind = DrafterKind::dflash2;
  dc.conv_kernel_size = 2;
  dc.conv_group_size = 4;
  dc.selector_rank = 6;
  dc.selector_top_k = 5;
  dc.output_multiplier = 1.0f;
  dc.final_logit_softcapping = 20.0f;
  DrafterModel drafter(dc, tops);
  drafter_init_params(drafter, 7);
  Rng r(8);
  for (const char* name : {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
                           "candidate_selector.hidden_projection.weight"}) {
    const DrafterParamEntry& e = drafter.table().find(name);
    for (int64_t i = 0; i < e.rows * e.cols; ++i) param_at(drafter, name)[i] = float(3.0 * r.normal());
  }
  drafter.set_frozen(target->embed, target->lm_head);
  const Dflash2SelectorDims d = dflash2_selector_dims(dc);
  int off_argmax = 0;
  CheckedDrafter bd(drafter, [&](const std::vector<float>& y, int32_t last) {
    const int n = d.block_size - 1;
    std::vector<float> logits(size_t(n) * size_t(d.vocab));
    for (int k = 0; k < n; ++k)
      for (int v = 0; v < d.vocab; ++v) {
        double s = 0;
        for (int h = 0; h < d.hidden; ++h)
          s += double(drafter.lm_head.ptr<float>()[int64_t(v) * d.hidden + h]) *
               double(y[size_t((k + 1) * d.hidden + h)]);
        logits[size_t(k) * size_t(d.vocab) + size_t(v)] = float(s);
      }
    const std::vector<int32_t> path = dflash2_selector_greedy_path<float>(
        d,
        {param_at(drafter, "candidate_selector.predecessor_codebook"),
         param_at(drafter, "candidate_selector.successor_codebook"),
         param_at(drafter, "candidate_selector.hidden_projection.weight")},
        logits.data(), y.data() + d.hidden, n, last);
    for (int k = 0; k < n; ++k) {
      const float* row = &logits[size_t(k) * size_t(d.vocab)];
      off_argmax += path[size_t(k)] != int32_t(std::max_element(row, row + d.vocab) - row);
    }
    return path;
  });
  const std::vector<int32_t> prompt = random_ids(10, c.vocab, 5);
  const int n = 15;
  SpecDecoder spec(*target, bd, 16, n);
  EXPECT_EQ(spec.run(prompt).tokens, greedy_by_full_forward(*target, ops, prompt, n));
  EXPECT_GE(bd.calls, 4);  // at most B = 4 tokens a block
  EXPECT_GT(off_argmax, 0) << "the walk never left the argmax: the selector was not exercised";
}

// drafter.kind = "dspark" decodes with its Markov-biased proposals and stays lossless: the committed tokens
// are the target's greedy ones, with every proposal verified and with the confidence-based verify length
// (which verifies fewer: at 0.4 the block ends after the first proposal whose running survival product drops
// below).
TEST_P(SpecDecodeTest, DSparkDrafterProposesWithItsHeadAndCommitsTheGreedyTokens) {
  CpuOps ops;
  CpuTrainOps tops;
  const QwenConfig c = cfg();
  auto target = target_random(c, 35, ops, with_lm_head());
  const std::vector<int32_t> prompt = random_ids(10, c.vocab, 5);
  const int n = 15;
  const std::vector<int32_t> greedy = greedy_by_full_forward(*target, ops, prompt, n);
  for (DrafterMarkovHead type : {DrafterMarkovHead::vanilla, DrafterMarkovHead::rnn}) {
    for (double threshold : {0.0, 0.4}) {
      DrafterConfig dc = tiny_drafter(c);
      dc.kind = DrafterKind::dspark;
      dc.markov_rank = 3;
      dc.markov_head_type = type;
      dc.enable_confidence_head = true;
      dc.confidence_head_with_markov = true;
      dc.confidence_head_alpha = 1.0f;
      DrafterModel drafter(dc, tops);
      drafter_init_params(drafter, 7);
      // Larger Markov weights than the init's, so that the bias changes proposals.
      Rng r(8);
      float* p = drafter.params.ptr<float>();
      for (const char* name : {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight"}) {
        const DrafterParamEntry& e = drafter.table().find(name);
        for (int64_t i = 0; i < e.rows * e.cols; ++i) p[e.offset + i] = float(r.normal());
      }
      drafter.set_frozen(target->embed, target->lm_head);
      DSparkHeadTensors<const float> w;
      w.markov_w1 = param_at(drafter, "markov_head.markov_w1.weight");
      w.markov_w2 = param_at(drafter, "markov_head.markov_w2.weight");
      if (type == DrafterMarkovHead::rnn) {
        w.joint_w = param_at(drafter, "markov_head.joint_proj.weight");
        w.joint_b = param_at(drafter, "markov_head.joint_proj.bias");
      }
      w.conf_w = param_at(drafter, "confidence_head.proj.weight");
      w.conf_b = param_at(drafter, "confidence_head.proj.bias");
      // The head's proposals, and with a threshold cut where the predicted prefix survival drops below it.
      CheckedDrafter bd(
          drafter,
          [&](const std::vector<float>& y, int32_t last) {
            std::vector<double> conf;
            std::vector<int32_t> want = dspark_block_propose<float>(
                dspark_head_dims(dc), w, drafter.lm_head.ptr<float>(), y.data(), last, &conf);
            EXPECT_EQ(conf.size(), want.size());
            if (threshold > 0) {
              size_t n = 0;
              double survive = 1;
              while (n < want.size() && (survive *= 1.0 / (1.0 + std::exp(-conf[n]))) >= threshold) ++n;
              want.resize(n);
            }
            return want;
          },
          threshold);
      SpecDecoder spec(*target, bd, 16, n);
      const SpecPromptResult res = spec.run(prompt);
      EXPECT_EQ(res.tokens, greedy) << drafter_markov_head_name(type) << " threshold " << threshold;
      EXPECT_EQ(res.verified, bd.verified);
      if (threshold == 0)
        EXPECT_EQ(bd.verified, int64_t(bd.calls) * (dc.block_size - 1));
      else
        EXPECT_LT(bd.verified, int64_t(bd.calls) * (dc.block_size - 1)) << "the verify length cut no block";
    }
  }
}

// The confidence-based verify length needs a DSpark drafter with a confidence head.
TEST(SpecDecode, ConfidenceThresholdNeedsADSparkConfidenceHead) {
  CpuTrainOps tops;
  DrafterModel dflash(df::testing::tiny_drafter_config(), tops);
  DrafterModel no_head(df::testing::tiny_dspark_config(DrafterMarkovHead::vanilla, 3, false), tops);
  for (DrafterModel* m : {&dflash, &no_head}) {
    try {
      DFlashBlockDrafter bd(*m, 0.5);
      ADD_FAILURE() << "a threshold was accepted for a drafter without a confidence head";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--dspark-confidence"), std::string::npos) << e.what();
    }
  }
  DrafterModel dspark(df::testing::tiny_dspark_config(), tops);
  EXPECT_NO_THROW(DFlashBlockDrafter(dspark, 0.5));
}

INSTANTIATE_TEST_SUITE_P(Families, SpecDecodeTest, ::testing::Values(0, 1, 2, 3, 4), target_family_name);

TEST(SampleToken, TemperatureAndTopP) {
  const float logits[4] = {0.0f, 1.0f, 2.0f, 3.0f};
  Rng rng(7);
  EXPECT_EQ(sample_token(logits, 4, {}, rng), 3);  // greedy
  // p ∝ e^0..e^3 = (0.032, 0.087, 0.237, 0.644): top_p 0.5 keeps only the most likely token.
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits, 4, {1.0f, 0.5f, 0}, rng), 3);
  // top_p 0.8 keeps {3, 2} with renormalised probabilities 0.731 / 0.269.
  int counts[4] = {0, 0, 0, 0};
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[sample_token(logits, 4, {1.0f, 0.8f, 0}, rng)]++;
  EXPECT_EQ(counts[0] + counts[1], 0);
  // Binomial standard deviation at n = 20000 is 0.003; 0.015 is five of them.
  EXPECT_NEAR(counts[3] / double(n), 0.731, 0.015);
  // Full distribution at temperature 2: p ∝ e^{0, .5, 1, 1.5} = (0.102, 0.168, 0.277, 0.456).
  int all[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; ++i) all[sample_token(logits, 4, {2.0f, 1.0f, 0}, rng)]++;
  EXPECT_NEAR(all[0] / double(n), 0.102, 0.015);
  EXPECT_NEAR(all[3] / double(n), 0.456, 0.015);
}
