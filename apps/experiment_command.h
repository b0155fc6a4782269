// `troupe experiment`: a grid of training runs, one after another, and what
// they show side by side (README, troupe experiment):
//   troupe experiment --config FILE --sweep KEY=V1,V2,... [--sweep ...]
//                     [--repeats R] [--out DIR] [--target auc=0.82]
//                     [--set key=value ...] [--fault SPEC ...] [--run-timeout S]
// Each run is `troupe train` in a process of its own (bounded in time),
// with its own run directory under DIR/runs. Then DIR/experiment.csv (a row
// a run: every swept key, the metric, rate, staleness, wire bytes, or why
// it failed), plots drawn by gnuplot (DIR/*.png) and DIR/report.md, which
// puts the table, the pictures, the config and the machine together. A run
// that fails is a row that says why; the sweep goes on. Exit status 1 when
// a run failed.
#pragma once

#include <CLI/CLI.hpp>

namespace troupe::apps {

void addExperimentCommand(CLI::App* app, int* result);

}  // namespace troupe::apps
