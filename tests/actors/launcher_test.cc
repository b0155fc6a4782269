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
#include <set>
#include <sstream>
#include <string>

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
    // ls lists its own descriptors: the standard ones and the one it reads
    // the directory through (the lowest free one: 3, or 0 where this test
    // runs with no standard input).
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

TEST(ChildProcessTest, AProgramThatCannotStartEndsWithStatus127) {
  ChildProcess child({"/nonexistent/troupe-test-program"}, "/dev/null");
  EXPECT_FALSE(child.wait(20s));
  EXPECT_EQ(child.poll(), 127);
}

}  // namespace
}  // namespace troupe::actors
