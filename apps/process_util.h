// Child processes of a local job or benchmark, and what a launcher tells a
// process about its place in a job.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <sys/types.h>
#include <vector>

#include <caf/fwd.hpp>

#include "common/status.h"
#include "transport/node.h"

namespace troupe::transport {
class RemoteActors;
}

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

// `threads` CAF scheduler threads with the work-sharing policy: idle threads
// sleep on a condition variable and wake when a message arrives, where work
// stealing polls with sleeps in between (measured here: round trips of
// 210-290 us with work stealing, 85-135 us with sharing). Every process that
// talks over the transport uses it.
void configureSharingScheduler(caf::actor_system_config& cfg, int threads);

// The two processes of a system benchmark: this one (the coordinator node,
// id `selfId`) and a serving process run as `childArgv` with
// "--coordinator <this node's address>" appended. A fresh job token is
// exported for the child. Returns once the child has joined, or an error
// naming what failed.
struct BenchPair {
  std::unique_ptr<transport::RemoteActors> remote;
  std::unique_ptr<ChildProcess> child;
};
Expected<BenchPair> startBenchPair(caf::actor_system& system, transport::NodeOptions node, uint64_t selfId,
                                   std::vector<std::string> childArgv);
// The serving side: joins `coordinator` as node `selfId` with the token
// from the environment.
Expected<std::unique_ptr<transport::RemoteActors>> joinBenchPair(caf::actor_system& system,
                                                                 transport::NodeOptions node, uint64_t selfId,
                                                                 const std::string& role,
                                                                 const std::string& coordinator);

// The rank a process launcher gave this process, if any: SLURM_PROCID
// (srun), OMPI_COMM_WORLD_RANK (Open MPI), PMI_RANK / PMIX_RANK (MPICH,
// PMIx), JOB_COMPLETION_INDEX (a Kubernetes indexed job), RANK.
std::optional<int64_t> launcherRank(std::string* from = nullptr);

}  // namespace troupe::apps
