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

}  // namespace troupe::testing
