// Each subcommand lives in its own cmd_*.cpp and registers itself on the root CLI11 app here.
#pragma once
#include <CLI/CLI.hpp>

namespace df {

struct TrainArgs {
  std::string config;
  std::string rankfile;
  int64_t stop_at_step = 0;  // > 0: checkpoint and exit cleanly after this step (time-boxed jobs, tests)
  bool fresh_start = false;  // move checkpoints the run would overwrite aside instead of refusing
  std::vector<std::string> allow_change;  // run-config keys a resume may change on purpose (--allow-change)
};
// `train` subcommand, and the root-level --config/--rankfile that run the same thing (DESIGN.md's command line).
void cmd_train_register(CLI::App& root);
void train_add_options(CLI::App& app, TrainArgs& args);
void train_run(const TrainArgs& args);

void cmd_extract_register(CLI::App& root);
void cmd_export_register(CLI::App& root);
void cmd_eval_register(CLI::App& root);  // eval (tau by speculative decoding) | eval --generate
void cmd_model_register(CLI::App& root);
void cmd_config_register(CLI::App& root);
void cmd_data_register(CLI::App& root);  // data convert | synth | info
void cmd_topo_register(CLI::App& app);  // topo discover | rankfile | nccl-xml
void cmd_plan_register(CLI::App& app);  // plan split | vram

}  // namespace df
