// A job across network namespaces: the coordinator and a peer each in a
// namespace of their own, joined by a veth pair with their own addresses, so
// the traffic crosses a (virtual) network between hosts instead of loopback.
// Needs root and iproute2; skipped with the reason otherwise. The namespaces
// are made by this test with unique names and deleted when it ends.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tests/common/netns.h"
#include "tests/common/subprocess.h"
#include "tests/common/temp_dir.h"
#include "tests/transport/transport_peer.h"

namespace troupe::transport::testing {
namespace {

using namespace std::chrono_literals;
using troupe::testing::Child;
using troupe::testing::runProcess;
using troupe::testing::TempDir;

using troupe::testing::NetnsPair;
using troupe::testing::shell;

TEST(TransportNetns, JobAcrossTwoNamespaces) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces (ip netns + veth)";
  if (!shell("command -v ip >/dev/null")) GTEST_SKIP() << "needs iproute2 (ip)";
  NetnsPair ns;
  if (!ns.ok()) GTEST_SKIP() << "could not make network namespaces here (ip netns add failed; no CAP_SYS_ADMIN?)";
  TempDir dir;
  const std::string portFile = dir.file("port");
  Child coordinator({"ip", "netns", "exec", ns.a_, selfExe(), "--peer", "coordinator", "--id", "1", "--listen",
                     ns.addrA_, "--port-file", portFile, "--expect-peer", "2"},
                    dir.file("coordinator.log"));
  std::string port;
  for (int i = 0; i < 2000 && port.empty(); ++i) {  // bounded: 20 s
    std::ifstream in(portFile);
    std::getline(in, port);
    if (port.empty()) std::this_thread::sleep_for(10ms);
  }
  ASSERT_FALSE(port.empty()) << "the coordinator wrote no port:\n" << coordinator.wait(1s).err;
  Child peer({"ip", "netns", "exec", ns.b_, selfExe(), "--peer", "echo", "--id", "2", "--listen", ns.addrB_,
              "--coordinator", ns.addrA_ + ":" + port},
             dir.file("peer.log"));
  auto c = coordinator.wait(60s);
  EXPECT_EQ(c.exitCode, 0) << c.err;
  EXPECT_NE(c.err.find("member 2 echo at " + ns.addrB_), std::string::npos) << c.err;
  auto p = peer.wait(20s);
  EXPECT_EQ(p.exitCode, 0) << p.err;
}

}  // namespace
}  // namespace troupe::transport::testing
