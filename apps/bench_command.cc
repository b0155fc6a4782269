#include "apps/bench_command.h"

#include "apps/cli_common.h"
#include "apps/transport_bench.h"
#include "common/logging.h"

namespace troupe::apps {

void addBenchCommand(CLI::App* app, int* result) {
  CLI::App* bench = app->add_subcommand("bench", "System benchmarks beside their ceilings and peers");
  bench->require_subcommand(1);
  auto options = std::make_shared<TransportBenchOptions>();
  auto logLevel = std::make_shared<std::string>("warn");
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
  transport->add_option("--log-level", *logLevel, "trace, debug, info, warn, error");
  transport->add_flag("--serve", options->serve)->group("");  // the receiving process
  transport->add_option("--coordinator", options->coordinator)->group("");
  transport->callback([=] {
    *result = runGuarded([&] {
      LoggingOptions logging;
      logging.level = *logLevel;
      logging.role = options->serve ? "bench/sink" : "bench";
      configureLogging(logging);
      return runTransportBench(*options);
    });
  });
}

}  // namespace troupe::apps
