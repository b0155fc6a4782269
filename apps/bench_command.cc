#include "apps/bench_command.h"

#include "apps/cli_common.h"
#include "apps/ps_bench.h"
#include "apps/transport_bench.h"
#include "common/logging.h"
#include "transport/node_config.h"

namespace troupe::apps {

void addBenchCommand(CLI::App* app, int* result) {
  CLI::App* bench = app->add_subcommand("bench", "System benchmarks beside their ceilings and peers");
  bench->require_subcommand(1);
  auto options = std::make_shared<TransportBenchOptions>();
  auto flags = std::make_shared<CommonFlags>();
  flags->logLevel = "warn";
  CLI::App* transport = bench->add_subcommand(
      "transport", "Actor-to-actor bandwidth and latency between two processes, beside ucx_perftest");
  transport->add_option("--json", options->jsonPath, "Also write the figures as JSON to this path");
  transport->add_option("--seconds", options->secondsPerSize, "Measuring time per payload size and trial")
      ->check(CLI::Range(0.05, 60.0));
  transport->add_option("--trials", options->trials, "Trials per figure; the median is reported")
      ->check(CLI::Range(1, 20));
  transport->add_option("--round-trips", options->latencyRoundTrips, "Round trips per latency trial")
      ->check(CLI::Range(10, 10000000));
  transport->add_flag("!--no-perftest", options->withPerftest, "Skip the ucx_perftest ceiling");
  addCommonFlags(transport, flags.get());
  transport->add_flag("--serve", options->serve)->group("");  // the receiving process
  transport->add_option("--coordinator", options->coordinator)->group("");
  transport->callback([=] {
    *result = runGuarded([&] {
      Config config = loadConfig(*flags);
      options->node = transport::nodeOptionsFromConfig(config);
      // The receiving process gets the same settings.
      options->passOn.clear();
      if (!flags->configPath.empty()) options->passOn = {"--config", flags->configPath};
      for (const auto& o : flags->overrides) {
        options->passOn.push_back("--set");
        options->passOn.push_back(o);
      }
      options->passOn.push_back("--log-level");
      options->passOn.push_back(config.getString("log.level"));
      return runTransportBench(*options);
    });
  });

  auto psOptions = std::make_shared<PsBenchOptions>();
  auto psFlags = std::make_shared<CommonFlags>();
  CLI::App* psCmd = bench->add_subcommand(
      "ps", "Push / pull throughput of a worker against a shard in another process, beside ucx_perftest");
  psCmd->add_option("--json", psOptions->jsonPath, "Also write the figures as JSON to this path");
  psCmd->add_option("--seconds", psOptions->seconds, "Measuring time per figure")->check(CLI::PositiveNumber);
  psCmd->add_flag("!--no-perftest", psOptions->withPerftest, "Skip the ucx_perftest ceiling");
  addCommonFlags(psCmd, psFlags.get());
  psCmd->add_flag("--serve", psOptions->serve)->group("");
  psCmd->add_option("--coordinator", psOptions->coordinator)->group("");
  psCmd->callback([=] {
    *result = runGuarded([&] {
      Config config = loadConfig(*psFlags);
      psOptions->node = transport::nodeOptionsFromConfig(config);
      psOptions->passOn.clear();
      if (!psFlags->configPath.empty()) psOptions->passOn = {"--config", psFlags->configPath};
      for (const auto& o : psFlags->overrides) psOptions->passOn.insert(psOptions->passOn.end(), {"--set", o});
      return runPsBench(*psOptions);
    });
  });
}

}  // namespace troupe::apps
