// `troupe gen-data criteo-synthetic`: writes a synthetic Criteo-format data set
// with a planted model (train.tsv, test.tsv, oracle.json) and prints the
// oracle's metrics, the best any learner can reach on that data.
#pragma once

#include <CLI/CLI.hpp>

namespace troupe::apps {

void addGenDataCommand(CLI::App* app, int* result);

}  // namespace troupe::apps
