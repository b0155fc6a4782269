// Starting the processes of a job (DESIGN.md, Processes and roles).
//
// ChildProcess: one child, killed by PID when its owner goes. LocalJob: the
// member processes of a job on this machine (`troupe train` with
// cluster.workers > 0), each `troupe launch --role R --rank N`, each logging
// to <dir>/<role>-<rank>.log; it starts a replacement for a lost rank, kills
// a lost one by PID (a stopped process must not come back), and stops them
// all when the job ends. launcherRank: what a launcher across machines
// (srun, mpirun, a Kubernetes job) says this process's rank is.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace troupe::actors {

// This executable's path (/proc/self/exe).
std::string selfExe();

// For a child between fork and exec, which holds nothing of its parent's
// but the standard streams: not every library marks its descriptors
// close-on-exec, and a socket a child kept open would hide its parent's
// death from the parent's peers. descriptorLimit() is read in the parent
// before the fork (the bound of the fallback loop where close_range is
// refused); closeInheritedDescriptors, in the child, makes system calls
// only.
int descriptorLimit();
void closeInheritedDescriptors(int limit);

// A child process, killed (by PID) when this goes away. The child also gets
// SIGTERM when this process dies (PR_SET_PDEATHSIG), so no job outlives its
// launcher.
//
// Each child leads a process group of its own, its standard input
// /dev/null. Signals meant for the launcher's group stay there:
// - Ctrl-C reaches the launcher alone, which ends the job in order (every
//   process told to stop), instead of every process dying at once and the
//   supervisor replacing the "crashed" ones while the job ends;
// - a process held stopped (a stop fault) is alone in its group with its
//   waker, so the kernel's SIGHUP and SIGCONT to an orphaned group that has
//   a stopped member (when a member exits after the group lost its parent
//   in the session: under a runner whose shell has gone) reach nobody
//   else: the other processes of the job would die of the SIGHUP.
// A terminal's other signals to the launcher (Ctrl-Z, a hang-up) reach the
// launcher only, too; its death reaches the children (PR_SET_PDEATHSIG).
class ChildProcess final {
 public:
  // stdout and stderr go to `logPath` ("" keeps ours, "/dev/null" drops
  // them; a file is appended to). Throws SetupError when fork fails.
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
  // SIGKILL now, and reaps it.
  void kill();

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

struct LocalJobOptions {
  // argv of `troupe launch` up to its own flags (the executable and
  // "launch"); each child gets --role, --coordinator and --rank after it,
  // then `extraArgs` (--config, --set, --log-level).
  std::vector<std::string> launchArgv;
  std::vector<std::string> extraArgs;
  std::string logDir;
};

// Thread-safe: the coordinator starts replacements from its own thread.
class LocalJob final {
 public:
  explicit LocalJob(LocalJobOptions options) : options_(std::move(options)) {}
  ~LocalJob();

  void setCoordinator(const std::string& address);
  // Starts the process of (role, rank); a second call replaces a process
  // that is gone (killing it first if it still runs).
  void start(const std::string& role, int64_t rank);
  // Kills (role, rank)'s process now, if it runs.
  void kill(const std::string& role, int64_t rank);
  // Something only the launcher can see: a process that exited with status
  // 2 (a bad config or set-up: every process would fail alike) or that
  // exited non-zero before the job started (before the coordinator could
  // know it). "" when there is none.
  std::string failure(bool jobStarted);
  // Waits up to `grace` for every process to exit, then kills what is left.
  void stopAll(std::chrono::milliseconds grace);
  // The processes that died of a signal nobody sent on purpose (SIGSEGV,
  // SIGABRT, ...: anything but SIGKILL, SIGTERM and SIGINT), one line
  // each, replaced ones included.
  std::vector<std::string> crashes();
  std::string logOf(const std::string& role, int64_t rank) const;

 private:
  struct Process {
    std::unique_ptr<ChildProcess> child;
    int64_t incarnation = 0;
    int64_t toldStatus = -1;  // the incarnation whose end the log told (or that was killed on purpose)
    bool crashNoted = false;   // the current child's crash is in crashes_
  };
  // Notes the current child of `p` in crashes_ if it died of a crash signal.
  void noteCrash(const std::pair<std::string, int64_t>& key, Process& p);
  std::vector<std::string> crashes_;
  LocalJobOptions options_;
  std::string coordinator_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int64_t>, Process> processes_;
};

// The rank a process launcher gave this process, if any: SLURM_PROCID
// (srun), OMPI_COMM_WORLD_RANK (Open MPI), PMI_RANK / PMIX_RANK (MPICH,
// PMIx), JOB_COMPLETION_INDEX (a Kubernetes indexed job), RANK. `from`
// names the variable. Throws SetupError when the variable is no rank.
std::optional<int64_t> launcherRank(std::string* from = nullptr);

}  // namespace troupe::actors
