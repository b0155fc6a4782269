// The `troupe` command line. Each subcommand lives in its own *_command.cc;
// this file only wires them up and maps parse errors to exit status 2.
#include <chrono>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "actors/actor_system.h"
#include "apps/bench_command.h"
#include "apps/chaos_command.h"
#include "apps/cli_common.h"
#include "apps/config_command.h"
#include "apps/experiment_command.h"
#include "kernels/cpu/blas_core.h"
#include "apps/gen_data_command.h"
#include "apps/inspect_command.h"
#include "apps/launch_command.h"
#include "apps/token_command.h"
#include "apps/train_command.h"
#include "apps/version_command.h"
#include "troupe/config.h"

int main(int argc, char** argv) {
  // First, before troupe starts any thread: OpenBLAS's kernels as wide as the CPU's
  // vectors (this may start the process again; kernels/cpu/blas_core.h).
  troupe::kernels::chooseBlasCore(argv);
  CLI::App app{"troupe: actor-model training for recommendation models and dense networks"};
  app.set_version_flag("--version", TROUPE_VERSION);
  app.require_subcommand(1);
  int result = troupe::apps::kExitOk;
  troupe::apps::addTrainCommand(&app, &result);
  troupe::apps::addLaunchCommand(&app, &result);
  troupe::apps::addGenDataCommand(&app, &result);
  troupe::apps::addConfigCommand(&app, &result);
  troupe::apps::addTokenCommand(&app, &result);
  troupe::apps::addVersionCommand(&app, &result);
  troupe::apps::addBenchCommand(&app, &result);
  troupe::apps::addInspectCommand(&app, &result);
  troupe::apps::addChaosCommand(&app, &result);
  troupe::apps::addExperimentCommand(&app, &result);
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      known = known || sub->check_name(argv[1]);
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "troupe: error: unknown command '%s' (commands: %s; see 'troupe --help')\n", argv[1],
                   names.c_str());
      return troupe::apps::kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "troupe: error: %s (see 'troupe --help')\n", e.what());
    return troupe::apps::kExitUsage;
  }
  // No library finalizer may run beside an actor thread's own exit (see
  // awaitActorThreadsGone); they are gone within milliseconds.
  if (const size_t left = troupe::actors::awaitActorThreadsGone(std::chrono::seconds(5))) {
    std::fprintf(stderr, "troupe: %zu actor threads still running 5 s after the work ended; exiting anyway\n", left);
  }
  return result;
}
