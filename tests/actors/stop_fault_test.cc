// A stop fault (actors::stopThisProcess) holds its process stopped for the
// whole duration, also when something else sends it SIGCONT before then:
// the kernel does so to every process of a process group that becomes
// orphaned while one of them is stopped (a CI runner's shell gone, and any
// process of the job exiting), and replica_cluster_test once saw a shard
// stopped for 5 s run on after 0.4 s, found by nobody. Real processes and
// signals: a child of this test stops itself, the test continues it from
// outside (SIGHUP and SIGCONT, as the kernel does), and the child must
// live, be stopped again and stay so to the end.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "actors/fault_injector.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The state letter of /proc/PID/stat ('T': stopped), or '?'.
char stateOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = all.rfind(')');
  return close == std::string::npos || close + 2 >= all.size() ? '?' : all[close + 2];
}

// Waits (bounded) until the state of `pid` is or is not 'T'.
bool waitState(pid_t pid, bool stopped, std::chrono::milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  while (Clock::now() < deadline) {
    if ((stateOf(pid) == 'T') == stopped) return true;
    std::this_thread::sleep_for(2ms);
  }
  return false;
}

// A child of this test, forked, that stops itself for `duration`
// (stopThisProcess) and exits with how many times it was stopped again, or
// 200 when it came back before the duration was up. Killed and reaped if
// the test ends first.
class StoppingChild {
 public:
  StoppingChild(int64_t fault, std::chrono::milliseconds duration) : pid_(::fork()) {
    if (pid_ != 0) return;
    // A group of its own, whose parent (this test) is in another group of
    // the session: not orphaned, so no SIGCONT comes but the test's.
    ::setpgid(0, 0);
    const auto start = Clock::now();
    const int again = stopThisProcess(fault, duration);
    const auto stoppedFor = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    ::_exit(stoppedFor >= duration ? std::min(again, 100) : 200);
  }
  ~StoppingChild() {
    if (pid_ > 0 && ::kill(pid_, SIGKILL) == 0) ::waitpid(pid_, nullptr, 0);  // (fails once it was waited for)
  }
  StoppingChild(const StoppingChild&) = delete;
  StoppingChild& operator=(const StoppingChild&) = delete;

  pid_t pid() const { return pid_; }
  // Its wait status once it ended within `bound`; nothing otherwise.
  std::optional<int> ended(std::chrono::milliseconds bound) {
    int status = 0;
    const auto deadline = Clock::now() + bound;
    pid_t done = 0;
    while ((done = ::waitpid(pid_, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
    if (done != pid_) return std::nullopt;
    return status;
  }

 private:
  pid_t pid_;
};

TEST(StopFault, AProcessContinuedFromOutsideIsStoppedAgainForTheWholeDuration) {
  StoppingChild child(1, 3000ms);
  ASSERT_GE(child.pid(), 0);
  ASSERT_TRUE(waitState(child.pid(), true, 5s)) << "the child never stopped";
  std::this_thread::sleep_for(500ms);  // (its waker has seen it stopped)
  // As the kernel does to an orphaned group: SIGHUP, then SIGCONT (the
  // child has SIGHUP's default action, which would end it).
  ASSERT_EQ(::kill(child.pid(), SIGHUP), 0);
  ASSERT_EQ(::kill(child.pid(), SIGCONT), 0);
  // Running for a moment at most (its waker looks every 20 ms), then stopped again.
  EXPECT_TRUE(waitState(child.pid(), true, 1s)) << "continued from outside and left running";
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(stateOf(child.pid()), 'T') << "not stopped 0.8 s into a 3 s stop";
  // It comes back once the duration is up, saying it was stopped again once.
  const auto status = child.ended(20s);
  ASSERT_TRUE(status.has_value()) << "the child did not come back within 20 s";
  ASSERT_TRUE(WIFEXITED(*status)) << "ended by signal " << (WIFSIGNALED(*status) ? WTERMSIG(*status) : 0);
  EXPECT_EQ(WEXITSTATUS(*status), 1) << "200: it came back early; else how many times it was stopped again";
}

// Without interference it is stopped once and continued once, after the duration.
TEST(StopFault, AStopLastsItsDurationAndIsStoppedOnce) {
  StoppingChild child(2, 400ms);
  ASSERT_GE(child.pid(), 0);
  const auto status = child.ended(20s);
  ASSERT_TRUE(status.has_value()) << "the child did not come back within 20 s";
  ASSERT_TRUE(WIFEXITED(*status)) << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

// Two stops asked for at once, from two threads: they take turns (the
// process stopped for both durations, one after the other), and SIGHUP's
// handling is what it was before either (each stop ignores it while it
// lasts: two at once could leave it ignored for good).
TEST(StopFault, TwoStopsAtOnceTakeTurnsAndLeaveSIGHUPAsItWas) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setpgid(0, 0);  // (as above: no SIGCONT but its own)
    // SIGHUP's default handling to begin with (it is ignored already under
    // nohup, where a stop that left it ignored could not be told apart).
    struct sigaction before = {};
    before.sa_handler = SIG_DFL;
    sigemptyset(&before.sa_mask);
    ::sigaction(SIGHUP, &before, nullptr);
    std::atomic<int> ready{0};
    const auto start = Clock::now();
    auto stop = [&](int64_t fault) {
      ++ready;
      while (ready.load() < 2) {
      }
      stopThisProcess(fault, 300ms);
    };
    std::thread a(stop, 3), b(stop, 4);
    a.join();
    b.join();
    const auto stoppedFor = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    struct sigaction now = {};
    ::sigaction(SIGHUP, nullptr, &now);
    if (now.sa_handler != before.sa_handler) ::_exit(3);  // changed (left ignored)
    ::_exit(stoppedFor >= 600ms ? 0 : 4);       // 4: the two overlapped
  }
  int status = 0;
  pid_t done = 0;
  const auto deadline = Clock::now() + 20s;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  if (done != pid) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    FAIL() << "the child did not come back within 20 s";
  }
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: SIGHUP left ignored; 4: stopped less than both durations";
}

}  // namespace
}  // namespace troupe::actors
