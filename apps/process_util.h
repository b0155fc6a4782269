// Child processes of a local job or benchmark, and what a launcher tells a
// process about its place in a job.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <sys/types.h>
#include <vector>

namespace troupe::apps {

// This executable's path (/proc/self/exe).
std::string selfExe();

// A child process, killed (by PID) when this goes away. The child also gets
// SIGTERM when this process dies (PR_SET_PDEATHSIG), so no job outlives its
// launcher.
class ChildProcess final {
 public:
  // stdout and stderr go to `logPath` ("" keeps ours, "/dev/null" drops
  // them). Throws SetupError when fork fails.
  explicit ChildProcess(std::vector<std::string> argv, const std::string& logPath = "");
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The exit status once it has exited (-signal when killed by one), checked
  // without blocking.
  std::optional<int> poll();
  // Waits up to `timeout` for an exit; true for status 0.
  bool wait(std::chrono::milliseconds timeout);
  // SIGTERM, then SIGKILL after `grace`.
  void stop(std::chrono::milliseconds grace);

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// The rank a process launcher gave this process, if any: SLURM_PROCID
// (srun), OMPI_COMM_WORLD_RANK (Open MPI), PMI_RANK / PMIX_RANK (MPICH,
// PMIx), JOB_COMPLETION_INDEX (a Kubernetes indexed job), RANK.
std::optional<int64_t> launcherRank(std::string* from = nullptr);

}  // namespace troupe::apps
