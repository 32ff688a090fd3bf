// `dflash_mpi model init`: writes a random-weight Hugging Face checkpoint from a config.json, for demos and
// tests that need a real model directory without downloading weights (f32, or FP8 projections with --fp8).
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/file_util.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "model/target.h"
#include "ops/ops_factory.h"

namespace df {

void cmd_model_register(CLI::App& root) {
  CLI::App* m = root.add_subcommand("model", "Target model utilities");
  m->require_subcommand(1);
  struct Args {
    std::string config, out;
    uint64_t seed = 1;
    bool force = false;
    bool fp8 = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* init = m->add_subcommand("init", "Write a random-weight checkpoint (config.json + model.safetensors)");
  init->add_option("--hf-config", args->config,
                   "a Hugging Face config.json (model_type qwen3, qwen3_5[_text], qwen3_moe, qwen3_5_moe[_text] or "
                   "qwen3_next)")
      ->required()->check(CLI::ExistingFile);
  init->add_option("--out", args->out, "output directory")->required();
  init->add_option("--seed", args->seed, "random seed")->capture_default_str();
  init->add_flag(
      "--fp8", args->fp8,
      "store the decoder projections as block-scaled FP8 (e4m3, 128x128 blocks, weight_scale_inv), "
      "the layout of the official Qwen FP8 releases");
  init->add_flag("--force", args->force,
                 "write into an existing non-empty --out (its config.json and "
                 "model.safetensors are replaced)");
  init->callback([args] {
    file_check_output(args->out, {args->config}, args->force);
    // The loader prefers the index: new config.json and model.safetensors next to it would load old shards.
    const bool sharded = std::filesystem::exists(args->out + "/model.safetensors.index.json");
    DF_CHECK(!sharded,
             "--out %s holds a sharded checkpoint (model.safetensors.index.json); writing into it "
             "would mix two models; HINT: choose a new --out",
             args->out.c_str());
    QwenConfig cfg = qwen_config_load(args->config);
    // fp32 weights in memory plus their bf16 copy on the way to model.safetensors: 6 bytes per parameter.
    const double params = cfg.params_non_embedding() +
                          double(cfg.vocab) * cfg.hidden * (cfg.tie_word_embeddings ? 1.0 : 2.0);
    host_memory_check(params * 6.0, strfmt("model init of %s (%.3g B parameters)", args->config.c_str(), params / 1e9),
                      "random weights are for small test configs; train against the real checkpoint instead");
    std::unique_ptr<Ops> ops = ops_create("cpu", 0);
    TargetLoadOptions opt;
    opt.need_lm_head = !cfg.tie_word_embeddings;
    std::unique_ptr<TargetModel> model = target_random(cfg, args->seed, *ops, opt);
    TargetSaveOptions save;
    if (args->fp8) save.fp8_block_n = save.fp8_block_k = 128;
    target_save_hf(*model, args->out, save);
    log_info("model init: wrote %s (%s, seed %llu%s)", args->out.c_str(), qwen_config_summary(cfg).c_str(),
             (unsigned long long)args->seed, args->fp8 ? ", FP8 projections in 128x128 blocks" : "");
  });
}

}  // namespace df
