// `dflash_mpi config check`: parses and validates a run config and prints every effective value, so a
// typo is found before a job waits in a queue for hours.
#include "cli/commands.h"
#include "core/config.h"
#include "core/log.h"

namespace df {

void cmd_config_register(CLI::App& root) {
  CLI::App* c = root.add_subcommand("config", "Run-config utilities");
  c->require_subcommand(1);
  auto path = std::make_shared<std::string>();
  CLI::App* chk = c->add_subcommand("check", "Validate a TOML run config and print its effective values");
  chk->add_option("--config", *path, "TOML run config")->required();
  chk->callback([path] {
    Config cfg = config_load(*path);
    log_info("%sconfig OK", config_table(cfg).c_str());
  });
}

}  // namespace df
