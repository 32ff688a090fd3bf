// dflash_mpi entry point: parses the command line, runs the chosen subcommand, and turns any error into
// a message with rank, host and file:line followed by MPI_Abort (or exit 1 outside MPI).
#include <mpi.h>

#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

int main(int argc, char** argv) {
  CLI::App app{"dflash_mpi: train DFlash speculative-decoding drafters for Qwen targets over MPI ranks"};
  app.require_subcommand(0, 1);
  app.footer("Without a subcommand, --config F runs `train` (mpirun -np N dflash_mpi --config F).\n"
             "Every subcommand has --help. The demo: bash launch/demo.sh");
  df::TrainArgs root_train;
  df::train_add_options(app, root_train);
  df::cmd_train_register(app);
  df::cmd_extract_register(app);
  df::cmd_export_register(app);
  df::cmd_eval_register(app);
  df::cmd_model_register(app);
  df::cmd_config_register(app);
  df::cmd_data_register(app);
  df::cmd_topo_register(app);
  df::cmd_plan_register(app);
  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty()) {
      if (root_train.config.empty()) {
        std::printf("%s", app.help().c_str());
        return 1;
      }
      df::train_run(root_train);
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const df::Error& e) {
    df::fatal_abort(e.what());
  } catch (const std::exception& e) {
    df::fatal_abort(std::string("unexpected error: ") + e.what());
  }
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
  return 0;
}
