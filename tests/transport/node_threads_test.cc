// Which thread runs a UCX node's handler: a peer's departure is reported on
// the node's polling side, never up the stack of a caller's send (a caller
// may hold locks of its own there: RemoteActors sends holding the lock of
// its node, and its onPeerDown may send).
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "transport/node.h"

namespace troupe::transport {
namespace {

using namespace std::chrono_literals;

class ThreadRecorder : public NodeHandler {
 public:
  explicit ThreadRecorder(std::thread::id caller) : caller_(caller) {}
  void onFrame(uint64_t, DecodedFrame, std::shared_ptr<const void>) override {}
  void onPeerDown(uint64_t, Departure how, const Status&) override {
    if (how == Departure::kUnreachable) unreachable++;
    if (std::this_thread::get_id() == caller_) onCaller++;
  }
  std::atomic<int> unreachable{0}, onCaller{0};

 private:
  const std::thread::id caller_;
};

TEST(NodeThreads, APeerDownIsNeverReportedOnASendersThread) {
  ThreadRecorder r(std::this_thread::get_id());
  NodeOptions o;
  o.nodeId = 1;
  o.role = "coordinator";
  o.token = "a-test-token-that-is-long-enough-0123";
  o.isCoordinator = true;
  auto node = Node::start(o, &r);
  ASSERT_TRUE(node.hasValue()) << node.status().message();
  // Each send to a node that is not a member is reported as unreachable.
  // The report waits on the node's queue, and the next send from this
  // thread may take the worker at once: before, it ran what was queued,
  // the report included, here.
  constexpr int kSends = 400;
  for (int i = 0; i < kSends; ++i) {
    Envelope e;
    e.kind = kFirstUserKind;
    e.body = "to nobody";
    (*node)->send(0xdead, std::move(e), {});
    if (i % 8 == 0) std::this_thread::sleep_for(50us);  // let the progress thread take some
  }
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (r.unreachable.load() < kSends && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(r.unreachable.load(), kSends);
  EXPECT_EQ(r.onCaller.load(), 0);
}

}  // namespace
}  // namespace troupe::transport
