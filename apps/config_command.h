// `troupe config show|keys`: print the resolved configuration or the schema.
#pragma once

#include <CLI/CLI.hpp>

namespace troupe::apps {

// Registers the subcommand on app; it sets *result to its exit status.
void addConfigCommand(CLI::App* app, int* result);

}  // namespace troupe::apps
