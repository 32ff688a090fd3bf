// `dflash_mpi eval`: the drafter's τ by real speculative decoding against the target, or with --generate the
// target's own continuations of the prompts as a token file. The work is in pipeline/eval.cpp.
#include "cli/commands.h"
#include "pipeline/eval.h"

namespace df {

void cmd_eval_register(CLI::App& root) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* c = root.add_subcommand(
      "eval",
      "Measure a drafter's acceptance length tau by greedy speculative decoding against the target "
      "(prints `tau X.XXX over N prompts`), or regenerate a dataset with the target (--generate)");
  c->add_option("--target", o->target, "Hugging Face target directory (config.json + safetensors)")
      ->required();
  auto* dr = c->add_option("--drafter", o->drafter, "Hugging Face drafter directory (as `export` writes it)");
  auto* ck = c->add_option("--checkpoint", o->checkpoint,
                           "a training checkpoint step_N.h5 (with --config; default: "
                           "<run.dir>/checkpoints/latest)");
  auto* cf = c->add_option("--config", o->config,
                           "the run config (TOML) whose drafter to evaluate, instead of "
                           "--drafter");
  dr->excludes(ck)->excludes(cf);
  ck->needs(cf);
  c->add_option("--prompts", o->prompts,
                "token file, one prompt per sequence: the tokens before the first loss_mask 0->1 step (a "
                "conversation of `data tokenize`: up to its first assistant turn), or the whole sequence when "
                "its mask has no 0->1 step (no mask, all ones or all zeros: a file of prompts, e.g. from "
                "`data convert`)")
      ->required();
  c->add_option("--max-new-tokens", o->max_new_tokens, "tokens generated per prompt")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--block-size", o->block_size, "block size B (default: the drafter's)")
      ->check(CLI::Range(2, 1024));
  c->add_option("--num-prompts", o->num_prompts, "use only the first N prompts (default: all)")
      ->check(CLI::PositiveNumber);
  c->add_option("--dspark-confidence", o->dspark_confidence,
                "DSpark drafters with a confidence head: verify only the leading proposals whose predicted "
                "prefix survival (the product of the confidence head's sigmoids) stays >= P; 0 verifies all "
                "B-1")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  c->add_option("--stop-token", o->sample.stop_tokens,
                "end a continuation at this token id (repeatable; e.g. "
                "the id of <|im_end|> in the target's tokenizer.json)");
  c->add_option("--device", o->device, "cpu, or cuda: the target and the drafter on GPU 0 (bf16)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  c->add_option("--out", o->out, "eval: per-prompt results as JSONL; --generate: the token file to write");
  c->add_flag("--generate", o->generate,
              "write the target's continuations (prompt masked out of the loss) to "
              "--out instead of measuring a drafter");
  c->add_option("--temperature", o->sample.temperature, "--generate: 0 = greedy")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--top-p", o->sample.top_p, "--generate: nucleus sampling mass")
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  c->add_option("--batch", o->batch, "--generate: prompts decoded side by side (one GEMM per layer for all)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--seed", o->sample.seed, "--generate: sampling seed (each prompt draws its own stream)")
      ->capture_default_str();
  c->callback([o] {
    if (o->generate) {
      if (!o->drafter.empty() || !o->checkpoint.empty() || !o->config.empty())
        throw CLI::ValidationError("--generate",
                                   "runs the target alone; drop --drafter / --checkpoint / --config");
      generate_run(*o);
    } else {
      if (o->drafter.empty() && o->config.empty())
        throw CLI::RequiredError("--drafter DIR (or --config T [--checkpoint F])");
      eval_run(*o);
    }
  });
}

}  // namespace df
