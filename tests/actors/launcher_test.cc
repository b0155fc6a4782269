// ChildProcess: what a process of a job starts with. Its children (the
// members of a local job, their replacements, the runs of a chaos campaign)
// must hold none of the launcher's files: a socket or pipe end kept open by
// a child outlives the launcher, and its peers see no end.
#include "actors/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/common/temp_dir.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

// A pipe whose ends are not close-on-exec (as a library's descriptors may
// be), closed when the test ends.
struct InheritablePipe {
  int read = -1, write = -1;
  InheritablePipe() {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    read = fds[0];
    write = fds[1];
  }
  ~InheritablePipe() {
    if (read >= 0) ::close(read);
    if (write >= 0) ::close(write);
  }
};

TEST(ChildProcessTest, AChildHoldsNoEndOfItsParentsPipes) {
  InheritablePipe pipe;
  ASSERT_GE(pipe.write, 0);
  ChildProcess child({"sleep", "30"}, "/dev/null");
  ASSERT_GT(child.pid(), 0);
  // The only writer left is the child, if it kept the end: then the read
  // end sees no end of file while the child lives (30 s).
  ::close(pipe.write);
  pipe.write = -1;
  pollfd p{pipe.read, POLLIN, 0};
  const int ready = ::poll(&p, 1, 5000);
  ASSERT_EQ(ready, 1) << "the pipe's write end is still open 5 s after the parent closed it";
  char c;
  EXPECT_EQ(::read(pipe.read, &c, 1), 0);  // end of file, no byte
  EXPECT_FALSE(child.poll().has_value());  // (the child still runs: it was not its exit that closed it)
  child.kill();
  EXPECT_EQ(child.poll(), -9);
}

TEST(ChildProcessTest, AChildStartsWithItsStandardStreamsAlone) {
  troupe::testing::TempDir dir;
  InheritablePipe pipe;
  // Descriptors far from the standard ones, as a process that has run a
  // while holds them.
  ASSERT_EQ(::dup2(pipe.write, 517), 517);
  const int file = ::open(dir.file("held").c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(file, 0);
  {
    // ls lists its own descriptors: the standard ones (its input /dev/null)
    // and the one it reads the directory through (the lowest free one: 3).
    ChildProcess child({"ls", "/proc/self/fd"}, dir.file("fds.log"));
    ASSERT_TRUE(child.wait(20s));
  }
  ::close(517);
  ::close(file);
  std::istringstream out(troupe::testing::readFile(dir.file("fds.log")));
  std::set<int> fds;
  for (std::string line; std::getline(out, line);) fds.insert(std::stoi(line));
  ASSERT_FALSE(fds.empty());
  EXPECT_LE(*fds.rbegin(), 3) << "the child holds descriptors it did not open itself";
  EXPECT_EQ(fds.count(1) + fds.count(2), 2u);  // its log
}

// Signals for the launcher's group (Ctrl-C, the kernel's SIGHUP to an
// orphaned group with a stopped member) must not reach the job's processes,
// and a process outside the terminal's foreground group must not read it.
TEST(ChildProcessTest, AChildLeadsAProcessGroupOfItsOwnWithNoInput) {
  // Our input a pipe while the child starts (whatever this test's input is).
  InheritablePipe pipe;
  const int savedInput = ::dup(0);  // (-1 where this test runs with no input)
  ASSERT_EQ(::dup2(pipe.read, 0), 0);
  ChildProcess child({"sleep", "30"}, "/dev/null");
  if (savedInput >= 0) {
    ASSERT_EQ(::dup2(savedInput, 0), 0);
    ::close(savedInput);
  } else {
    ::close(0);
  }
  ASSERT_GT(child.pid(), 0);
  // (setpgid runs in the parent before the constructor returns, too)
  EXPECT_EQ(::getpgid(child.pid()), child.pid());
  EXPECT_NE(::getpgid(child.pid()), ::getpgrp());
  // Once it runs sleep (20 s at most), its input is /dev/null, not our pipe.
  std::string comm;
  for (int i = 0; i < 2000 && comm != "sleep\n"; ++i) {
    std::ifstream in(fmt::format("/proc/{}/comm", child.pid()));
    comm.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (comm != "sleep\n") std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(comm, "sleep\n");
  char buf[256];
  const ssize_t n = ::readlink(fmt::format("/proc/{}/fd/0", child.pid()).c_str(), buf, sizeof buf - 1);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, size_t(n)), "/dev/null");
  child.kill();
  EXPECT_EQ(child.poll(), -9);
}

TEST(ChildProcessTest, AProgramThatCannotStartEndsWithStatus127) {
  ChildProcess child({"/nonexistent/troupe-test-program"}, "/dev/null");
  EXPECT_FALSE(child.wait(20s));
  EXPECT_EQ(child.poll(), 127);
}

}  // namespace
}  // namespace troupe::actors
