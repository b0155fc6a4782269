// `troupe launch`: one process of a multi-process job (apps/job.h), started
// by whatever places processes on machines (srun, mpirun, a Kubernetes job,
// or a shell):
//   troupe launch --role coordinator --coordinator HOST:PORT --config job.toml [--set ...]
//   troupe launch --role ps|worker --coordinator HOST:PORT [--listen ADDRESS] [--rank N]
// Every process needs the job's secret token, in the file transport.token_file
// names (`--set transport.token_file=FILE`) or in TROUPE_JOB_TOKEN. A ps or worker
// gets the job's config from the coordinator; its rank is --rank, else the
// launcher's rank variable (SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK,
// PMIX_RANK, JOB_COMPLETION_INDEX, RANK), else the coordinator's choice.
#pragma once

#include <CLI/CLI.hpp>

namespace troupe::apps {

void addLaunchCommand(CLI::App* app, int* result);

}  // namespace troupe::apps
