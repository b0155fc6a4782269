// What every `troupe` subcommand shares: --config, --set, --log-level and
// --threads, loading them into one Config, and turning set-up errors into one
// line on stderr with exit status 2.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/config.h"

namespace troupe::apps {

// Exit statuses of the `troupe` binary.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the job ran and failed
inline constexpr int kExitUsage = 2;    // bad command line, config or input

struct CommonFlags {
  std::string configPath;
  std::vector<std::string> overrides;
  std::string logLevel;
  int threads = -1;  // -1: from the config
  // --fault SPEC, repeated (train and launch): added to the config's fault
  // plan, faults.plan.
  std::vector<std::string> faults;
};

// Adds --config, --set, --log-level and --threads to a subcommand.
void addCommonFlags(CLI::App* cmd, CommonFlags* flags);

// Adds --fault to a subcommand that runs a job (train, launch).
void addFaultFlag(CLI::App* cmd, CommonFlags* flags);

// Defaults, then the file, then the overrides, then the explicit flags.
// Also configures logging. Throws SetupError.
Config loadConfig(const CommonFlags& flags);

// Compute threads from the config (0 = all cores).
int resolveThreads(const Config& config);

// Runs fn, mapping SetupError to "troupe: error: ..." and exit status 2, and
// any other exception to "troupe: internal error: ..." and status 1.
int runGuarded(const std::function<int()>& fn);

}  // namespace troupe::apps
