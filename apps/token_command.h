// `troupe token`: a fresh job token (256 random bits as 64 hex digits), on
// standard output or, with --out FILE, in a new file only this user may read
// (mode 0600; an existing file is never overwritten). Every process of a job
// takes it from that file (transport.token_file) or from TROUPE_JOB_TOKEN.
#pragma once

#include <CLI/CLI.hpp>

namespace troupe::apps {

void addTokenCommand(CLI::App* app, int* result);

}  // namespace troupe::apps
