// Each subcommand lives in its own cmd_*.cpp and registers itself on the root CLI11 app here.
#pragma once
#include <CLI/CLI.hpp>

namespace df {

void cli_register_data(CLI::App& app);  // data convert | synth | info

}  // namespace df
