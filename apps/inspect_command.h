// `troupe inspect CHECKPOINT`: what a checkpoint holds (the cut, the job's
// shape, every shard's tables, rows and sizes), after verifying every file's
// size and checksum. A checkpoint that is incomplete, truncated or corrupt
// is one line on stderr naming the file and what is wrong, and exit status 2.
#pragma once

#include <CLI/CLI.hpp>

namespace troupe::apps {

void addInspectCommand(CLI::App* app, int* result);

}  // namespace troupe::apps
