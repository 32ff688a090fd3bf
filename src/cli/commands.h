// Each subcommand lives in its own cmd_*.cpp and registers itself on the root CLI11 app here.
#pragma once
#include <CLI/CLI.hpp>

namespace df {

void cmd_extract_register(CLI::App& root);
void cmd_model_register(CLI::App& root);
void cmd_config_register(CLI::App& root);
void cmd_data_register(CLI::App& root);  // data convert | synth | info
void cmd_topo_register(CLI::App& app);  // topo discover | rankfile | nccl-xml
void cmd_plan_register(CLI::App& app);  // plan split | vram

}  // namespace df
