// `troupe chaos`: a campaign of short jobs, each with a fault plan drawn at
// random (README, troupe chaos):
//   troupe chaos --config FILE --runs N --seed S [--mix kill,stop,slow]
//                [--modes bsp,ssp,asp,allreduce,hybrid] [--set key=value ...]
// Each run is `troupe train` in a process of its own, bounded in time; one
// line per run and a total are printed, chaos.json is written, and the
// command exits 1 if any run did not finish, lost or applied a sample
// twice (its ledger), hung, or had a process crash.
#pragma once

#include <CLI/CLI.hpp>

namespace troupe::apps {

void addChaosCommand(CLI::App* app, int* result);

}  // namespace troupe::apps
