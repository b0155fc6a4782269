// `troupe version`: troupe's version and the versions of the libraries it runs
// on (CAF, UCX, Cap'n Proto, spdlog, OpenBLAS, CUDA when built).
#pragma once

#include <CLI/CLI.hpp>

namespace troupe::apps {

void addVersionCommand(CLI::App* app, int* result);

}  // namespace troupe::apps
