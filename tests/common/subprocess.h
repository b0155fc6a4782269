// Runs a program to completion with a deadline and captures what it printed.
// The child is killed (SIGKILL, by PID) if it outlives the deadline, so a test
// never leaves processes behind.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace troupe::testing {

struct ProcessResult {
  int exitCode = -1;     // exit status, or -1 when killed by a signal
  int signal = 0;        // the signal that ended it, 0 if it exited
  bool timedOut = false;
  std::string out;       // stdout
  std::string err;       // stderr
};

ProcessResult runProcess(const std::vector<std::string>& argv,
                         std::chrono::milliseconds timeout = std::chrono::seconds(60),
                         const std::string& workingDir = "");

// A child process running beside the test. Its stdout and stderr go to
// `logPath` (or are discarded when empty). The destructor kills it (SIGKILL,
// by PID) and reaps it if it is still running, so a failing test leaves no
// process behind.
// This test binary's own path (/proc/self/exe): tests whose peers are the
// binary run again.
std::string selfExe();

class Child final {
 public:
  Child(const std::vector<std::string>& argv, const std::string& logPath = "");
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  int pid() const { return pid_; }
  // Waits for the child to end, killing it after `timeout`.
  ProcessResult wait(std::chrono::milliseconds timeout);
  // Sends `signal` now (no-op once reaped).
  void kill(int signal);

 private:
  int pid_ = -1;
  bool reaped_ = false;
  std::string logPath_;
};

}  // namespace troupe::testing
