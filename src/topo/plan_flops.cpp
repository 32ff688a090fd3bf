// plan_flops_compute: a batch laid out as the data path lays it out (sequences of seq_len packed to the token
// budget, a loss mask of all ones), the anchors drawn and capped by the drafter loop's own functions, and the
// FLOP formulas of model/model_flops.h over them.
#include "topo/plan_flops.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "core/strfmt.h"
#include "model/drafter_config.h"
#include "model/model_flops.h"
#include "topo/plan_vram.h"
#include "train/anchors.h"

namespace df {

FlopsPlan plan_flops_compute(const Config& cfg, const QwenConfig& target, int64_t seq_len) {
  DF_CHECK(seq_len >= 0, "--seq-len %lld must be positive", (long long)seq_len);
  FlopsPlan p;
  p.tokens = cfg.data.token_budget;
  p.seq_len = seq_len > 0 ? std::min(seq_len, p.tokens) : p.tokens;
  p.grad_accum = cfg.train.grad_accum;
  const VramPlan vram = plan_vram_compute(cfg, target, 1, "plan flops");
  p.target_layers_run = vram.target_layers_run;
  p.payload_bytes = vram.payload_bytes;
  p.grad_bytes = 4.0 * double(vram.drafter_flat);

  DrafterBatch batch;
  std::vector<int64_t> lens;
  batch.offsets.push_back(0);
  for (int64_t start = 0; start < p.tokens; start += p.seq_len) {
    lens.push_back(std::min(p.seq_len, p.tokens - start));
    batch.offsets.push_back(start + lens.back());
    p.target_flops +=
        double(lens.back()) * target_forward_flops_per_token(target, lens.back(), p.target_layers_run);
  }
  p.seqs = int64_t(lens.size());
  batch.loss_mask.assign(size_t(p.tokens), 1);
  const DrafterConfig dc = drafter_config_from_run(cfg, target);
  Rng rng(rng_mix(cfg.run.seed, 0));
  std::vector<DrafterAnchor> anchors = anchors_sample_batch(batch, dc.num_anchors, rng);
  p.anchors = int64_t(anchors.size());
  anchors_cap(anchors, drafter_limits_from_run(cfg).max_blocks, rng);
  p.blocks = int64_t(anchors.size());
  p.drafter_flops = drafter_step_flops(dc, anchors, lens);
  return p;
}

double plan_allreduce_bytes(double grad_bytes, int drafters) {
  DF_CHECK(drafters >= 1, "an all-reduce needs at least one drafter (got %d)", drafters);
  return 2.0 * (drafters - 1) / drafters * grad_bytes;
}

std::string plan_flops_format(const FlopsPlan& p) {
  std::string out =
      strfmt("batch: %lld tokens as %lld sequence(s) of %lld (pass --seq-len for your data's)\n",
             (long long)p.tokens, (long long)p.seqs, (long long)p.seq_len);
  out += strfmt(
      "target forward:  %10.4g TFLOP a batch, %8.4g GFLOP a token (%d layers run; model/model_flops.h)\n",
      p.target_flops / 1e12, p.target_flops / double(p.tokens) / 1e9, p.target_layers_run);
  out += strfmt(
      "drafter step:    %10.4g TFLOP a micro-batch, %8.4g GFLOP a context token (%lld anchor blocks "
      "sampled, %lld kept)\n",
      p.drafter_flops / 1e12, p.drafter_flops / double(p.tokens) / 1e9, (long long)p.anchors,
      (long long)p.blocks);
  out += strfmt(
      "target/drafter:  %10.4g x the FLOPs a batch (targets per drafter at equal per-GPU efficiency)\n",
      p.target_flops / p.drafter_flops);
  out += strfmt("feature stream:  %10.4g GB a batch, %.0f B a token (target -> drafter)\n",
                p.payload_bytes / 1e9, p.payload_bytes / double(p.tokens));
  out += strfmt(
      "gradients:       %10.4g GB fp32 per drafter, all-reduced once every %d micro-batch(es); a ring "
      "moves 2(D-1)/D of it per drafter\n",
      p.grad_bytes / 1e9, p.grad_accum);
  return out;
}

std::string plan_flops_json(const FlopsPlan& p) {
  const nlohmann::json j = {{"tokens", p.tokens},
                            {"seq_len", p.seq_len},
                            {"seqs", p.seqs},
                            {"target_layers_run", p.target_layers_run},
                            {"target_flops", p.target_flops},
                            {"anchors", p.anchors},
                            {"blocks", p.blocks},
                            {"drafter_flops", p.drafter_flops},
                            {"payload_bytes", p.payload_bytes},
                            {"grad_bytes", p.grad_bytes},
                            {"grad_accum", p.grad_accum}};
  return j.dump();
}

}  // namespace df
