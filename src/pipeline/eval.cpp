// eval / generate: load the target (every layer and its lm_head) and the drafter (a Hugging Face folder, or a
// training checkpoint with its run config), run the prompts one at a time, report and write the results.
#include "pipeline/eval.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/config.h"
#include "core/error.h"
#include "core/file_util.h"
#include "core/log.h"
#include "core/strfmt.h"
#include "ops/ops_factory.h"
#include "train/checkpoint.h"
#include "train/init_from.h"

namespace df {

namespace {

struct Loaded {
  TokenData data;
  std::vector<std::vector<int32_t>> prompts;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<TargetModel> target;
  int64_t max_prompt = 1;
};

Loaded load_target_and_prompts(const EvalOptions& o) {
  DF_CHECK(o.max_new_tokens >= 1, "eval: --max-new-tokens %lld must be ≥ 1", (long long)o.max_new_tokens);
  Loaded L;
  L.data = token_file_read(o.prompts);
  L.ops = ops_create(o.device, 0);
  TargetLoadOptions topt;
  topt.need_lm_head = true;
  L.target = target_load(o.target, *L.ops, topt);
  const int64_t n =
      o.num_prompts > 0 ? std::min(o.num_prompts, L.data.num_sequences()) : L.data.num_sequences();
  for (int64_t s = 0; s < n; ++s) {
    std::vector<int32_t> p = eval_prompt(L.data, s, o.prompts);
    for (int32_t id : p)
      DF_CHECK(
          id >= 0 && id < L.target->cfg.vocab,
          "%s: sequence %lld holds token id %d outside the target's vocabulary [0, %d); HINT: were these "
          "prompts tokenized for this target?",
          o.prompts.c_str(), (long long)s, id, L.target->cfg.vocab);
    L.max_prompt = std::max(L.max_prompt, int64_t(p.size()));
    L.prompts.push_back(std::move(p));
  }
  DF_CHECK(!L.prompts.empty(), "%s holds no sequences; HINT: one prompt per sequence", o.prompts.c_str());
  return L;
}

std::unique_ptr<DrafterModel> load_drafter(const EvalOptions& o, const QwenConfig& target, TrainOps& tops) {
  DrafterConfig dc;
  std::string ckpt = o.checkpoint;
  if (!o.drafter.empty()) {
    dc = drafter_config_load_hf(o.drafter);
    DF_CHECK(
        dc.hidden == target.hidden && dc.vocab == target.vocab,
        "eval: drafter %s has hidden_size %d / vocab_size %d but the target %s has %d / %d; HINT: --drafter "
        "must be a drafter trained for this target",
        o.drafter.c_str(), dc.hidden, dc.vocab, o.target.c_str(), target.hidden, target.vocab);
  } else {
    DF_CHECK(
        !o.config.empty(),
        "eval: give --drafter DIR, or --config (the run's TOML) with an optional --checkpoint step_N.h5");
    const Config cfg = config_load(o.config);
    dc = drafter_config_from_run(cfg, target);
    if (ckpt.empty()) {  // the run's latest, as `export` picks it
      ckpt = checkpoint_find_latest(cfg.run.dir + "/checkpoints");
      DF_CHECK(!ckpt.empty(),
               "eval: no checkpoint under %s/checkpoints; HINT: pass --checkpoint or train first",
               cfg.run.dir.c_str());
    }
  }
  if (o.block_size > 0) dc.block_size = o.block_size;  // the weights do not depend on B
  drafter_config_validate(dc);
  auto m = std::make_unique<DrafterModel>(dc, tops);
  if (!o.drafter.empty())
    drafter_load_hf_weights(*m, o.drafter);
  else
    checkpoint_load(ckpt, *m);
  return m;
}

std::string histogram_line(const SpecSummary& s) {
  std::string line = "acceptance length histogram (blocks):";
  for (size_t a = 1; a < s.accept_hist.size(); ++a)
    line += strfmt("  %zu: %lld (%.1f%%)", a, (long long)s.accept_hist[a],
                   100.0 * double(s.accept_hist[a]) / double(std::max<int64_t>(s.blocks, 1)));
  return line;
}

}  // namespace

std::vector<int32_t> eval_prompt(const TokenData& data, int64_t s, const std::string& where) {
  // The rule gives every non-empty sequence a prompt of at least one token: only an empty sequence has none.
  DF_CHECK(data.sequence_length(s) > 0,
           "%s: sequence %lld is empty (offsets[%lld] = offsets[%lld] = %lld), so it holds no prompt; HINT: "
           "rewrite the token file without empty sequences (`dflash_mpi data info` counts them)",
           where.c_str(), (long long)s, (long long)s, (long long)s + 1, (long long)data.offsets[size_t(s)]);
  const auto first = data.tokens.begin() + data.offsets[size_t(s)];
  return std::vector<int32_t>(first, first + token_data_prompt_length(data, s));
}

SpecSummary eval_run(const EvalOptions& o) {
  Loaded L = load_target_and_prompts(o);
  // The drafter on the target's device: on CUDA it reads the target's bf16 embedding/lm_head and the context
  // taps where the target decoder leaves them (same GPU; SpecDecoder orders the two streams).
  std::unique_ptr<TrainOps> tops = train_ops_create(o.device, 0);
  std::unique_ptr<DrafterModel> drafter = load_drafter(o, L.target->cfg, *tops);
  drafter->set_frozen(L.target->embed, L.target->lm_head);
  DFlashBlockDrafter bd(*drafter, o.dspark_confidence);
  const int B = bd.block_size();
  log_info("eval: %zu prompts (longest %lld tokens), %lld new tokens each, block %d, %s", L.prompts.size(),
           (long long)L.max_prompt, (long long)o.max_new_tokens, B,
           qwen_config_summary(L.target->cfg).c_str());
  SpecDecoder spec(*L.target, bd, L.max_prompt, o.max_new_tokens);
  SpecSummary sum;
  std::string jsonl;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t s = 0; s < L.prompts.size(); ++s) {
    const SpecPromptResult r = spec.run(L.prompts[s], o.sample.stop_tokens);
    sum.add(r, B);
    nlohmann::json j = {{"prompt", s},
                        {"prompt_tokens", L.prompts[s].size()},
                        {"new_tokens", r.tokens.size()},
                        {"tau", r.tau()},
                        {"accept_lengths", r.accept_lengths},
                        {"verified", r.verified},
                        {"prefill_s", r.prefill_s},
                        {"draft_s", r.draft_s},
                        {"verify_s", r.verify_s},
                        {"tokens", r.tokens}};
    jsonl += j.dump() + "\n";
    log_info("eval: prompt %zu / %zu: tau %.3f over %zu blocks", s + 1, L.prompts.size(), r.tau(),
             r.accept_lengths.size());
  }
  const double wall = seconds_since(t0);
  const double work = std::max(sum.draft_s + sum.verify_s, 1e-12);
  std::printf("tau %.3f over %lld prompts\n", sum.tau(), (long long)sum.prompts);
  std::printf("%s\n", histogram_line(sum).c_str());
  std::printf("draft tokens verified per block: %.3f of %d\n",
              double(sum.verified) / double(std::max<int64_t>(sum.blocks, 1)), B - 1);
  std::printf(
      "time: prefill %.3f s, draft %.3f s (%.1f%%), verify %.3f s (%.1f%%); %lld new tokens in %.3f s, "
      "%.1f tok/s\n",
      sum.prefill_s, sum.draft_s, 100.0 * sum.draft_s / work, sum.verify_s, 100.0 * sum.verify_s / work,
      (long long)sum.new_tokens, wall, double(sum.new_tokens) / std::max(wall, 1e-12));
  std::fflush(stdout);
  if (!o.out.empty()) {
    file_write_text_atomic(o.out, jsonl);
    log_info("eval: wrote %s (one JSON object per prompt)", o.out.c_str());
  }
  return sum;
}

void generate_run(const EvalOptions& o) {
  DF_CHECK(!o.out.empty(), "eval --generate: --out F.h5 names the token file to write");
  Loaded L = load_target_and_prompts(o);
  const int slots = int(std::min<int64_t>(o.batch, int64_t(L.prompts.size())));
  TargetDecoder dec(*L.target,
                    {L.max_prompt + o.max_new_tokens, std::max<int64_t>(L.max_prompt, slots), 1, slots}, {});
  TokenData out;
  out.vocab_size = L.target->cfg.vocab;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t generated = 0;
  for (size_t s0 = 0; s0 < L.prompts.size(); s0 += size_t(slots)) {
    const size_t s1 = std::min(L.prompts.size(), s0 + size_t(slots));
    const std::vector<std::vector<int32_t>> group(L.prompts.begin() + s0, L.prompts.begin() + s1);
    std::vector<Rng> rngs;  // each prompt its own stream: the output depends on neither order nor batch
    for (size_t s = s0; s < s1; ++s) rngs.emplace_back(rng_mix(o.sample.seed, s));
    const std::vector<std::vector<int32_t>> cont =
        target_generate(dec, group, o.max_new_tokens, o.sample, rngs);
    for (size_t i = 0; i < group.size(); ++i) {
      out.tokens.insert(out.tokens.end(), group[i].begin(), group[i].end());
      out.tokens.insert(out.tokens.end(), cont[i].begin(), cont[i].end());
      out.loss_mask.insert(out.loss_mask.end(), group[i].size(), 0);
      out.loss_mask.insert(out.loss_mask.end(), cont[i].size(), 1);
      generated += int64_t(cont[i].size());
      out.offsets.push_back(int64_t(out.tokens.size()));
    }
    log_info("eval --generate: %zu / %zu prompts", s1, L.prompts.size());
  }
  token_data_validate(out, o.out);
  token_file_write(o.out, out);
  const double wall = seconds_since(t0);
  std::printf("generated %lld tokens for %zu prompts in %.3f s (%.1f tok/s), %s; wrote %s\n",
              (long long)generated, L.prompts.size(), wall, double(generated) / std::max(wall, 1e-12),
              o.sample.temperature > 0
                  ? strfmt("temperature %g top_p %g seed %llu", double(o.sample.temperature),
                           double(o.sample.top_p), (unsigned long long)o.sample.seed)
                        .c_str()
                  : "greedy",
              o.out.c_str());
}

}  // namespace df
