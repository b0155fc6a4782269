#include "apps/config_command.h"

#include <cstdio>
#include <memory>

#include "apps/cli_common.h"

namespace troupe::apps {

void addConfigCommand(CLI::App* app, int* result) {
  auto* cmd = app->add_subcommand("config", "Inspect configuration");
  cmd->require_subcommand(1);

  auto showFlags = std::make_shared<CommonFlags>();
  auto* show = cmd->add_subcommand("show", "Print the resolved configuration (defaults + file + --set) as TOML");
  addCommonFlags(show, showFlags.get());
  show->callback([=] {
    *result = runGuarded([&] {
      Config config = loadConfig(*showFlags);
      std::fputs(config.toToml().c_str(), stdout);
      return kExitOk;
    });
  });

  auto* keys = cmd->add_subcommand("keys", "List every configuration key with its type, default and meaning");
  keys->callback([=] {
    *result = runGuarded([] {
      std::fputs(Config(troupeConfigSchema()).describe().c_str(), stdout);
      return kExitOk;
    });
  });
}

}  // namespace troupe::apps
