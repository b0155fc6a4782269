// `troupe train`: trains the configured model on the configured data, in one
// process with every role an actor, and reports test metrics (next to the
// oracle's for synthetic data). Keeps a run directory with the config used,
// metrics.csv (one row per evaluation), train.log and summary.json.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace troupe::apps {

void addTrainCommand(CLI::App* app, int* result);

// `troupe launch --role coordinator`: the training job's coordinator at
// `address` (host:port), with the processes started elsewhere.
struct CommonFlags;
int runCoordinatorCommand(const CommonFlags& common, const std::string& address, const std::string& summaryJson,
                          int metricsPort = 0);

}  // namespace troupe::apps
