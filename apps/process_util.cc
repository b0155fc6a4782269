#include "apps/process_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>

#include "common/check.h"
#include "transport/node_config.h"
#include "transport/remote_actors.h"

namespace troupe::apps {

std::string selfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return std::string(buf, size_t(std::max<ssize_t>(n, 0)));
}

ChildProcess::ChildProcess(std::vector<std::string> argv, const std::string& logPath) {
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) TROUPE_SETUP_ERROR("cannot start '{}': fork failed", argv.empty() ? "" : argv[0]);
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the parent is already gone
    if (!logPath.empty()) {
      const int fd = open(logPath.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
    }
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !status_) {
    ::kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
}

std::optional<int> ChildProcess::poll() {
  if (status_ || pid_ <= 0) return status_;
  int status;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  return status_;
}

bool ChildProcess::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!poll() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status_ && *status_ == 0;
}

void ChildProcess::stop(std::chrono::milliseconds grace) {
  if (poll() || pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  if (wait(grace) || poll()) return;
  ::kill(pid_, SIGKILL);
  int status;
  if (waitpid(pid_, &status, 0) == pid_) status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

void configureSharingScheduler(caf::actor_system_config& cfg, int threads) {
  cfg.set("scheduler.max-threads", std::max(1, threads));
  cfg.set("scheduler.policy", caf::atom("sharing"));
}

Expected<BenchPair> startBenchPair(caf::actor_system& system, transport::NodeOptions node, uint64_t selfId,
                                   std::vector<std::string> childArgv) {
  const std::string token = transport::newJobToken();
  ::setenv(transport::kJobTokenVariable, token.c_str(), 1);
  node.nodeId = selfId;
  node.role = "bench";
  node.isCoordinator = true;
  node.token = token;
  auto remote = transport::RemoteActors::start(system, node);
  if (!remote.hasValue()) return remote.status();
  BenchPair pair;
  pair.remote = std::move(*remote);
  childArgv.insert(childArgv.end(), {"--coordinator", pair.remote->node().address()});
  pair.child = std::make_unique<ChildProcess>(childArgv);
  Status joined = pair.remote->node().waitForMembers(2, std::chrono::seconds(30));
  if (!joined.isOk()) {
    return Status::unavailable(fmt::format("the serving process did not join: {}", joined.message()));
  }
  return pair;
}

Expected<std::unique_ptr<transport::RemoteActors>> joinBenchPair(caf::actor_system& system,
                                                                 transport::NodeOptions node, uint64_t selfId,
                                                                 const std::string& role,
                                                                 const std::string& coordinator) {
  node.nodeId = selfId;
  node.role = role;
  node.token = transport::jobTokenFromEnvironment();
  node.coordinator = coordinator;
  return transport::RemoteActors::start(system, node);
}

std::optional<int64_t> launcherRank(std::string* from) {
  for (const char* name : {"SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "JOB_COMPLETION_INDEX",
                           "RANK"}) {
    const char* v = std::getenv(name);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long long r = std::strtoll(v, &end, 10);
    if (*end != '\0' || r < 0) TROUPE_SETUP_ERROR("{}='{}' is not a rank", name, v);
    if (from) *from = name;
    return int64_t(r);
  }
  return std::nullopt;
}

}  // namespace troupe::apps
