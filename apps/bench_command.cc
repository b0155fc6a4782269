#include "apps/bench_command.h"

#include "apps/cli_common.h"
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
}

}  // namespace troupe::apps
