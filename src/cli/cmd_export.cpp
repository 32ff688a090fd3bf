// `dflash_mpi export`: a training checkpoint → a Hugging Face DFlash draft model (config.json + bf16
// model.safetensors) that SGLang / vLLM load as a speculative-decoding drafter; or, with --drafter, a Hugging
// Face drafter folder (SpecForge's own save, a published drafter) rewritten in that layout.
#include "cli/commands.h"
#include "core/config.h"
#include "core/file_util.h"
#include "core/log.h"
#include "model/drafter.h"
#include "ops/cpu/cpu_train_ops.h"
#include "train/checkpoint.h"
#include "train/export_hf.h"

namespace df {

void cmd_export_register(CLI::App& root) {
  struct Args {
    std::string config, checkpoint, drafter, out;
    bool force = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* e = root.add_subcommand("export", "Write a checkpoint's drafter as a Hugging Face DFlash model");
  CLI::Option* config = e->add_option(
      "--config", args->config, "the run's TOML config (target, run.dir; the drafter comes from the checkpoint)");
  CLI::Option* checkpoint =
      e->add_option("--checkpoint", args->checkpoint, "a step_*.h5 file (default: <run.dir>/checkpoints/latest)");
  e->add_option("--drafter", args->drafter,
                "instead of --config: a Hugging Face drafter folder (config.json + model.safetensors, as "
                "drafter.init_from reads it) to write in the export layout")
      ->check(CLI::ExistingDirectory)
      ->excludes(config)
      ->excludes(checkpoint);
  e->add_option("--out", args->out, "output directory")->required();
  e->add_flag("--force", args->force,
              "write into an existing non-empty --out (its config.json and "
              "model.safetensors are replaced)");
  e->callback([args] {
    if (!args->drafter.empty()) {
      file_check_output(args->out, {args->drafter}, args->force);
      CpuTrainOps ops;
      drafter_export_hf_folder(args->drafter, args->out, ops);
      log_info("export: %s -> %s (config.json + model.safetensors, bf16)", args->drafter.c_str(), args->out.c_str());
      return;
    }
    DF_CHECK(!args->config.empty(), "export: give --config (the run's TOML) with an optional --checkpoint, or "
                                    "--drafter DIR");
    Config cfg = config_load(args->config);
    QwenConfig target = qwen_config_load(cfg.target.architecture());
    std::string ckpt = args->checkpoint;
    if (ckpt.empty()) {
      ckpt = checkpoint_find_latest(cfg.run.dir + "/checkpoints");
      DF_CHECK(!ckpt.empty(), "no checkpoint under %s/checkpoints; HINT: pass --checkpoint or train first",
               cfg.run.dir.c_str());
    }
    file_check_output(args->out, {args->config, ckpt, cfg.run.dir}, args->force);
    // The checkpoint is the truth for what was trained: its drafter (taps, mask id, block size, shapes) is
    // exported, whatever the TOML says now; a disagreement is reported, not silently written.
    const CheckpointHeader h = checkpoint_read_header(ckpt);
    for (const CheckpointChange& c : checkpoint_config_changes(h, ckpt, cfg, drafter_config_from_run(cfg, target)))
      log_warn("export: %s says %s = %s but %s was trained with %s; exporting what was trained", args->config.c_str(),
               c.key.c_str(), c.now.c_str(), ckpt.c_str(), c.checkpoint.c_str());
    CpuTrainOps ops;
    DrafterModel model(h.drafter, ops);
    CheckpointState st = checkpoint_load(ckpt, model);
    drafter_export_hf(args->out, model, target.layers);
    log_info("export: %s (step %lld) -> %s (config.json + model.safetensors, bf16)", ckpt.c_str(),
             (long long)st.step, args->out.c_str());
  });
}

}  // namespace df
