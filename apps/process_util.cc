#include "apps/process_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "common/check.h"

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
