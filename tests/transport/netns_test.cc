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

#include "tests/common/subprocess.h"
#include "tests/common/temp_dir.h"
#include "tests/transport/transport_peer.h"

namespace troupe::transport::testing {
namespace {

using namespace std::chrono_literals;
using troupe::testing::Child;
using troupe::testing::runProcess;
using troupe::testing::TempDir;

bool run(const std::string& cmd) {
  auto r = runProcess({"/bin/sh", "-c", cmd}, 20s);
  return r.exitCode == 0;
}

class NetnsPair final {
 public:
  NetnsPair() {
    const std::string tag = std::to_string(getpid() % 100000);
    a_ = "trpA" + tag;
    b_ = "trpB" + tag;
    const int subnet = 16 + int(getpid() % 200);
    addrA_ = "10.231." + std::to_string(subnet) + ".1";
    addrB_ = "10.231." + std::to_string(subnet) + ".2";
    const std::string va = "tva" + tag, vb = "tvb" + tag;
    ok_ = run("ip netns add " + a_) && run("ip netns add " + b_) &&
          run("ip link add " + va + " netns " + a_ + " type veth peer name " + vb + " netns " + b_) &&
          run("ip -n " + a_ + " addr add " + addrA_ + "/24 dev " + va) &&
          run("ip -n " + b_ + " addr add " + addrB_ + "/24 dev " + vb) && run("ip -n " + a_ + " link set " + va + " up") &&
          run("ip -n " + b_ + " link set " + vb + " up") && run("ip -n " + a_ + " link set lo up") &&
          run("ip -n " + b_ + " link set lo up");
    // UCX lists the interfaces that are running when a process starts, and
    // the kernel reports a veth's carrier with a delay: wait for it (bounded).
    bool up = false;
    for (int i = 0; ok_ && i < 300 && !up; ++i) {
      up = run("ip -n " + a_ + " link show " + va + " | grep -q 'state UP'") &&
           run("ip -n " + b_ + " link show " + vb + " | grep -q 'state UP'");
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ok_ = ok_ && up;
  }
  ~NetnsPair() {
    run("ip netns del " + a_ + " 2>/dev/null");
    run("ip netns del " + b_ + " 2>/dev/null");
  }
  bool ok() const { return ok_; }
  std::string a_, b_, addrA_, addrB_;

 private:
  bool ok_ = false;
};

TEST(TransportNetns, JobAcrossTwoNamespaces) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces (ip netns + veth)";
  if (!run("command -v ip >/dev/null")) GTEST_SKIP() << "needs iproute2 (ip)";
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
