// Each subcommand lives in its own cmd_*.cpp and registers itself on the root CLI11 app here.
#pragma once
#include <CLI/CLI.hpp>

namespace df {

void cmd_topo_register(CLI::App& app);  // topo discover | rankfile | nccl-xml
void cmd_plan_register(CLI::App& app);  // plan split

}  // namespace df
