#include "actors/launcher.h"

#include <cstring>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "common/check.h"
#include "common/logging.h"

namespace troupe::actors {

std::string selfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return std::string(buf, size_t(std::max<ssize_t>(n, 0)));
}

int descriptorLimit() {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY) return 65536;
  return int(std::min<rlim_t>(files.rlim_cur, 1 << 20));
}

void closeInheritedDescriptors(int limit) {
  if (close_range(3, ~0u, 0) != 0) {
    for (int fd = 3; fd < limit; ++fd) close(fd);
  }
}

namespace {

int statusOf(int raw) { return WIFEXITED(raw) ? WEXITSTATUS(raw) : -WTERMSIG(raw); }

}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> argv, const std::string& logPath) {
  if (argv.empty()) TROUPE_SETUP_ERROR("cannot start a process without a program");
  const pid_t parent = getpid();
  // Made before the fork: the child allocates nothing.
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const int maxFd = descriptorLimit();
  pid_ = fork();
  if (pid_ < 0) TROUPE_SETUP_ERROR("cannot start '{}': fork failed", argv[0]);
  if (pid_ > 0) setpgid(pid_, pid_);  // (the child does it too: whichever runs first)
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the parent is already gone
    setpgid(0, 0);  // a group of its own (the header says why)
    // Not in the terminal's foreground group any more: a read from it would
    // stop the process (SIGTTIN). Nothing of a job reads its input. And a
    // write to it (no log file given) would stop it under `stty tostop`
    // (SIGTTOU): ignored (which outlives the exec).
    if (const int in = open("/dev/null", O_RDONLY); in >= 0 && in != 0) {
      dup2(in, 0);
      close(in);
    }
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGTTOU, &ignore, nullptr);
    if (!logPath.empty()) {
      const int fd = open(logPath.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        if (fd > 2) close(fd);  // (a parent without stdout gets the log as 1 or 2 itself)
      }
    }
    // A socket of the coordinator's held by a replacement it started would
    // outlive the coordinator, hiding its death from its peers and keeping
    // its listening port open to connections nobody accepts.
    closeInheritedDescriptors(maxFd);
    execvp(args[0], args.data());
    _exit(127);
  }
}

ChildProcess::~ChildProcess() { kill(); }

void ChildProcess::kill() {
  if (pid_ > 0 && !status_) {
    ::kill(pid_, SIGKILL);
    int raw;
    if (waitpid(pid_, &raw, 0) == pid_) status_ = statusOf(raw);
  }
}

std::optional<int> ChildProcess::poll() {
  if (status_ || pid_ <= 0) return status_;
  int raw;
  if (waitpid(pid_, &raw, WNOHANG) == pid_) status_ = statusOf(raw);
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
  kill();
}

// ---------------------------------------------------------------- LocalJob

LocalJob::~LocalJob() {
  std::lock_guard<std::mutex> lock(mutex_);
  processes_.clear();  // each child is killed by PID
}

void LocalJob::setCoordinator(const std::string& address) {
  std::lock_guard<std::mutex> lock(mutex_);
  coordinator_ = address;
}

std::string LocalJob::logOf(const std::string& role, int64_t rank) const {
  return fmt::format("{}/{}-{}.log", options_.logDir, role, rank);
}

void LocalJob::start(const std::string& role, int64_t rank) {
  std::vector<std::string> argv = options_.launchArgv;
  std::lock_guard<std::mutex> lock(mutex_);
  argv.insert(argv.end(), {"--role", role, "--coordinator", coordinator_, "--rank", std::to_string(rank)});
  argv.insert(argv.end(), options_.extraArgs.begin(), options_.extraArgs.end());
  Process& p = processes_[{role, rank}];
  if (p.child) {
    noteCrash({role, rank}, p);
    p.child->kill();
    p.crashNoted = false;
    ++p.incarnation;
    logger("job")->info("starting a new process for {} {} (its log goes on in {})", role, rank, logOf(role, rank));
  }
  p.child = std::make_unique<ChildProcess>(argv, logOf(role, rank));
}

void LocalJob::kill(const std::string& role, int64_t rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = processes_.find({role, rank});
  if (it != processes_.end() && it->second.child && !it->second.child->poll()) {
    logger("job")->info("killing {} {} (pid {})", role, rank, it->second.child->pid());
    it->second.child->kill();
    it->second.toldStatus = it->second.incarnation;
  }
}

void LocalJob::noteCrash(const std::pair<std::string, int64_t>& key, Process& p) {
  auto status = p.child && !p.crashNoted ? p.child->poll() : std::nullopt;
  if (!status || *status >= 0) return;
  const int sig = -*status;
  if (sig == SIGKILL || sig == SIGTERM || sig == SIGINT) return;
  p.crashNoted = true;
  crashes_.push_back(fmt::format("{} {} (pid {}) died of signal {} ({}); see {}", key.first, key.second,
                                 p.child->pid(), sig, strsignal(sig), logOf(key.first, key.second)));
}

std::vector<std::string> LocalJob::crashes() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, p] : processes_) noteCrash(key, p);
  return crashes_;
}

std::string LocalJob::failure(bool jobStarted) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, p] : processes_) {
    noteCrash(key, p);
    auto status = p.child ? p.child->poll() : std::nullopt;
    if (!status || *status == 0) continue;
    const std::string name = fmt::format("{} {} (pid {})", key.first, key.second, p.child->pid());
    const std::string log = logOf(key.first, key.second);
    if (*status == 2) return fmt::format("{} refused its set-up (exit status 2); see {}", name, log);
    if (!jobStarted) {
      return *status > 0 ? fmt::format("{} exited with status {} before the job started; see {}", name, *status, log)
                         : fmt::format("{} was killed by signal {} before the job started; see {}", name, -*status, log);
    }
    // The coordinator handles the loss; the log says how the process ended
    // (a crash by signal is told apart from an exit of its own).
    if (p.toldStatus != p.incarnation) {
      p.toldStatus = p.incarnation;
      if (*status > 0) {
        logger("job")->warn("{} exited with status {}; see {}", name, *status, log);
      } else {
        logger("job")->warn("{} was killed by signal {} ({}); see {}", name, -*status, strsignal(-*status), log);
      }
    }
  }
  return "";
}

void LocalJob::stopAll(std::chrono::milliseconds grace) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (auto& [key, p] : processes_) {
    if (!p.child) continue;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    p.child->wait(std::max(left, std::chrono::milliseconds(0)));
  }
  for (auto& [key, p] : processes_) {
    if (p.child) p.child->stop(std::chrono::seconds(2));
  }
}

std::optional<int64_t> launcherRank(std::string* from) {
  // The innermost launcher first: mpirun inside a Slurm allocation leaves
  // every rank the allocation's SLURM_PROCID.
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "JOB_COMPLETION_INDEX",
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

}  // namespace troupe::actors
