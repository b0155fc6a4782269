// Two network namespaces joined by a veth pair, each with its own address,
// made by a test (as root) and deleted when it ends: a job whose processes
// sit in them talks over a (virtual) network instead of loopback.
#pragma once

#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "tests/common/subprocess.h"

namespace troupe::testing {

inline bool shell(const std::string& cmd) {
  auto r = runProcess({"/bin/sh", "-c", cmd}, std::chrono::seconds(20));
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
    va_ = "tva" + tag;
    vb_ = "tvb" + tag;
    const std::string& va = va_;
    const std::string& vb = vb_;
    ok_ = shell("ip netns add " + a_) && shell("ip netns add " + b_) &&
          shell("ip link add " + va + " netns " + a_ + " type veth peer name " + vb + " netns " + b_) &&
          shell("ip -n " + a_ + " addr add " + addrA_ + "/24 dev " + va) &&
          shell("ip -n " + b_ + " addr add " + addrB_ + "/24 dev " + vb) && shell("ip -n " + a_ + " link set " + va + " up") &&
          shell("ip -n " + b_ + " link set " + vb + " up") && shell("ip -n " + a_ + " link set lo up") &&
          shell("ip -n " + b_ + " link set lo up");
    ok_ = ok_ && waitUp();
  }
  // Cuts the two namespaces apart (A's end of the veth down: a real
  // partition, no packet crosses), and joins them again.
  bool cut() { return shell("ip -n " + a_ + " link set " + va_ + " down"); }
  bool join() { return shell("ip -n " + a_ + " link set " + va_ + " up") && waitUp(); }
  // UCX lists the interfaces that are running when a process starts, and
  // the kernel reports a veth's carrier with a delay: wait for it (bounded).
  bool waitUp() {
    for (int i = 0; i < 300; ++i) {
      if (shell("ip -n " + a_ + " link show " + va_ + " | grep -q 'state UP'") &&
          shell("ip -n " + b_ + " link show " + vb_ + " | grep -q 'state UP'")) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  ~NetnsPair() {
    shell("ip netns del " + a_ + " 2>/dev/null");
    shell("ip netns del " + b_ + " 2>/dev/null");
  }
  bool ok() const { return ok_; }
  std::string a_, b_, addrA_, addrB_, va_, vb_;

 private:
  bool ok_ = false;
};

}  // namespace troupe::testing
