#include "apps/cli_common.h"

#include <cstdio>
#include <exception>

#include "common/check.h"
#include "common/compute_pool.h"
#include "common/logging.h"

namespace troupe::apps {

void addCommonFlags(CLI::App* cmd, CommonFlags* flags) {
  cmd->add_option("--config", flags->configPath, "TOML configuration file");
  cmd->add_option("--set", flags->overrides, "override one key: --set data.synthetic.rows=100000")
      ->allow_extra_args(false);
  cmd->add_option("--log-level", flags->logLevel, "trace, debug, info, warn, error, critical, off");
  cmd->add_option("--threads", flags->threads, "compute threads; 0 = all cores");
}

void addFaultFlag(CLI::App* cmd, CommonFlags* flags) {
  cmd->add_option("--fault", flags->faults,
                  "inject this fault (repeatable): kind=kill|stop|slow,target=worker[:RANK]|ps[:RANK] and when "
                  "(at_step=N, at_s=S or every_s=S; README, Fault plans); a multi-process job's coordinator runs the "
                  "plan")
      ->type_name("SPEC")
      ->allow_extra_args(false);
}

Config loadConfig(const CommonFlags& flags) {
  Config config(troupeConfigSchema());
  if (!flags.configPath.empty()) config.loadFile(flags.configPath);
  for (const auto& o : flags.overrides) config.set(o);
  for (const auto& f : flags.faults) config.append("faults.plan", f);
  if (!flags.logLevel.empty()) config.setValue("log.level", flags.logLevel);
  if (flags.threads >= 0) config.setValue("run.threads", int64_t{flags.threads});
  LoggingOptions logging;
  logging.level = config.getString("log.level");
  configureLogging(logging);
  return config;
}

int resolveThreads(const Config& config) {
  const int64_t t = config.getInt("run.threads");
  return t == 0 ? ComputePool::hardwareThreads() : int(t);
}

int runGuarded(const std::function<int()>& fn) {
  try {
    return fn();
  } catch (const SetupError& e) {
    std::fprintf(stderr, "troupe: error: %s\n", e.what());
    logger("apps")->debug("set-up error raised at {}:{}", e.file(), e.line());
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe: internal error: %s\n", e.what());
    return kExitFailure;
  }
}

}  // namespace troupe::apps
