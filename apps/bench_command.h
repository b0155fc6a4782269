// `troupe bench <topic>`: system benchmarks measured beside their ceilings or
// peers in the same run. Every topic prints a table with the ratios and takes
// --json PATH for scripts and plots. Topics: transport.
#pragma once

#include <CLI/CLI.hpp>

namespace troupe::apps {

void addBenchCommand(CLI::App* app, int* result);

}  // namespace troupe::apps
