#include "apps/bench_command.h"

#include <charconv>
#include <sstream>

#include "apps/cli_common.h"
#include "bench/system/allreduce_bench.h"
#include "bench/system/ps_bench.h"
#include "bench/system/transport_bench.h"

#include "common/check.h"
#include "common/logging.h"
#include "transport/node_config.h"

namespace troupe::apps {

using namespace bench;

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
  auto transportSizes = std::make_shared<std::string>();
  transport->add_option("--sizes", *transportSizes,
                        "Comma-separated payload sizes in bytes (default 4096,65536,1048576,16777216)");
  addCommonFlags(transport, flags.get());
  transport->add_flag("--serve", options->serve)->group("");  // the receiving process
  transport->add_option("--coordinator", options->coordinator)->group("");
  transport->callback([=] {
    *result = runGuarded([&] {
      Config config = loadConfig(*flags);
      options->node = transport::nodeOptionsFromConfig(config);
      if (!transportSizes->empty()) {
        options->sizes.clear();
        std::stringstream ss(*transportSizes);
        std::string item;
        while (std::getline(ss, item, ',')) {
          uint64_t b = 0;
          const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), b);
          if (ec != std::errc() || end != item.data() + item.size() || b == 0 || b > (uint64_t{1} << 30)) {
            TROUPE_SETUP_ERROR("--sizes: '{}' is not a size in bytes from 1 to 1073741824", item);
          }
          options->sizes.push_back(b);
        }
      }
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

  auto arOptions = std::make_shared<AllReduceBenchOptions>();
  auto arFlags = std::make_shared<CommonFlags>();
  arFlags->logLevel = "warn";
  auto arSizes = std::make_shared<std::string>();
  CLI::App* arCmd = bench->add_subcommand(
      "allreduce", "All-reduce latency and bus bandwidth with 2 and 4 processes, beside Gloo and Open MPI");
  arCmd->add_option("--json", arOptions->jsonPath, "Also write the figures as JSON rows to this path");
  arCmd->add_option("--trials", arOptions->trials, "Trials per figure; the median is reported")->check(CLI::Range(1, 20));
  arCmd->add_flag("!--no-peers", arOptions->withPeers, "Skip Gloo and Open MPI");
  arCmd->add_option("--sizes", *arSizes, "Comma-separated buffer sizes in bytes (default 4096,1048576,67108864)");
  addCommonFlags(arCmd, arFlags.get());
  arCmd->add_option("--rank", arOptions->rank)->group("");
  arCmd->add_option("--n", arOptions->n)->group("");
  arCmd->add_option("--coordinator", arOptions->coordinator)->group("");
  arCmd->callback([=] {
    *result = runGuarded([&] {
      Config config = loadConfig(*arFlags);
      arOptions->node = transport::nodeOptionsFromConfig(config);
      arOptions->chunkBytes = size_t(config.getInt("collectives.chunk_kb")) << 10;
      arOptions->smallBytes = size_t(config.getInt("collectives.small_kb")) << 10;
      arOptions->spinUs = int(config.getInt("collectives.spin_us"));
      if (!arSizes->empty()) {
        arOptions->sizes.clear();
        std::stringstream ss(*arSizes);
        std::string item;
        while (std::getline(ss, item, ',')) {
          const uint64_t b = std::stoull(item);
          if (b < 4 || b % 4 != 0) TROUPE_SETUP_ERROR("--sizes: {} is not a positive multiple of 4 bytes", item);
          arOptions->sizes.push_back(b);
        }
      }
      arOptions->passOn.clear();
      if (!arFlags->configPath.empty()) arOptions->passOn = {"--config", arFlags->configPath};
      for (const auto& o : arFlags->overrides) arOptions->passOn.insert(arOptions->passOn.end(), {"--set", o});
      return runAllReduceBench(*arOptions);
    });
  });
}

}  // namespace troupe::apps
