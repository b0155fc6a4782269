// Multi-process tests of the transport on loopback: the test process is the
// coordinator; peers are this binary run again with --peer (transport_peer.h).
// Every child is bounded in time and killed by PID when a test ends.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include "common/hash.h"
#include "common/logging.h"
#include "tests/common/subprocess.h"
#include "tests/common/temp_dir.h"
#include "tests/transport/transport_peer.h"
#include "transport/remote_actors.h"

namespace troupe::transport::testing {
namespace {

using namespace std::chrono_literals;
using troupe::testing::Child;
using troupe::testing::TempDir;

constexpr uint64_t kCoordinatorId = 1;

class TransportJob : public ::testing::Test {
 protected:
  // Subclasses may change the coordinator's options in their constructor.
  uint64_t maxFrameBytes_ = uint64_t{1} << 32;
  std::chrono::milliseconds heartbeatTimeout_{1000};

  void SetUp() override {
    // The system keeps a reference to its config: it must outlive it.
    config_ = std::make_unique<caf::actor_system_config>();
    config_->set("scheduler.max-threads", 2);
    system_ = std::make_unique<caf::actor_system>(*config_);
    NodeOptions options;
    options.nodeId = kCoordinatorId;
    options.role = "coordinator";
    options.isCoordinator = true;
    options.token = "test-token";
    options.heartbeatInterval = 100ms;
    options.heartbeatTimeout = heartbeatTimeout_;
    options.maxFrameBytes = maxFrameBytes_;
    auto remote = RemoteActors::start(*system_, options);
    ASSERT_TRUE(remote.hasValue()) << remote.status().message();
    remote_ = std::move(*remote);
  }
  void TearDown() override {
    for (auto& c : children_) c->kill(SIGKILL);
    children_.clear();
    remote_.reset();
    system_.reset();
  }

  std::string coordinatorAddress() const { return remote_->node().address(); }

  Child& spawnPeer(const std::string& mode, uint64_t id, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {selfExe(),          "--peer", mode, "--id", std::to_string(id),
                                     "--coordinator", coordinatorAddress()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    children_.push_back(std::make_unique<Child>(argv, dir_.file("peer-" + std::to_string(id) + ".log")));
    return *children_.back();
  }

  caf::message ask(const caf::actor& dest, caf::message msg, std::chrono::milliseconds timeout = 10s) {
    return troupe::transport::testing::ask(*system_, dest, std::move(msg), timeout);
  }

  // The echo's (count, ordered) once it has counted `n` messages, or its
  // last answer after `tries` asks `every` apart (or an error).
  caf::message seqCheckUntil(const caf::actor& echo, int64_t n, int tries, std::chrono::milliseconds every) {
    caf::message reply;
    for (int i = 0; i < tries; ++i) {
      reply = ask(echo, caf::make_message(seqcheck_atom::value));
      if (!reply.match_elements<int64_t, bool>() || reply.get_as<int64_t>(0) >= n) break;
      std::this_thread::sleep_for(every);
    }
    return reply;
  }

  std::unique_ptr<caf::actor_system_config> config_;
  std::unique_ptr<caf::actor_system> system_;
  std::unique_ptr<RemoteActors> remote_;
  std::vector<std::unique_ptr<Child>> children_;
  TempDir dir_;
};

TEST_F(TransportJob, RequestReplyAcrossProcesses) {
  spawnPeer("echo", 2);
  ASSERT_TRUE(remote_->node().waitForMembers(2, 20s).isOk());
  auto echo = remote_->remoteActor(2, "echo");
  auto reply = ask(echo, caf::make_message(add_atom::value, int64_t(40), int64_t(2)));
  ASSERT_TRUE(reply.match_elements<int64_t>()) << caf::to_string(reply);
  EXPECT_EQ(reply.get_as<int64_t>(0), 42);
  reply = ask(echo, caf::make_message(whoami_atom::value));
  ASSERT_TRUE(reply.match_elements<uint64_t>()) << caf::to_string(reply);
  EXPECT_EQ(reply.get_as<uint64_t>(0), 2u);
  // A message that has no handler there comes back as an error, not silence.
  reply = ask(echo, caf::make_message(std::string("no handler for this")));
  EXPECT_TRUE(reply.match_elements<caf::error>()) << caf::to_string(reply);
  // A message that cannot cross processes fails at once.
  struct Local {};
  reply = ask(echo, caf::make_message(add_atom::value, std::vector<int>{1, 2}));
  ASSERT_TRUE(reply.match_elements<caf::error>()) << caf::to_string(reply);
  // A name nobody published fails the request instead of hanging.
  reply = ask(remote_->remoteActor(2, "nobody"), caf::make_message(add_atom::value, int64_t(1), int64_t(2)));
  EXPECT_TRUE(reply.match_elements<caf::error>()) << caf::to_string(reply);
  // This node's own published actors come back as themselves.
  auto local = system_->spawn([]() -> caf::behavior { return {[](add_atom, int64_t a, int64_t b) { return a * b; }}; });
  remote_->publish(local, "local");
  EXPECT_EQ(remote_->remoteActor(kCoordinatorId, "local"), local);
  EXPECT_EQ(caf::to_string(ask(remote_->remoteActor(kCoordinatorId, "local"),
                               caf::make_message(add_atom::value, int64_t(6), int64_t(7)))),
            "(42)");
  caf::anon_send_exit(local, caf::exit_reason::user_shutdown);
  EXPECT_EQ(caf::to_string(ask(echo, caf::make_message(quit_atom::value))), "(true)");
  auto done = children_.back()->wait(10s);
  EXPECT_EQ(done.exitCode, 0) << done.err;
}

TEST_F(TransportJob, LargeTensorsRoundTripByteForByte) {
  spawnPeer("echo", 2);
  ASSERT_TRUE(remote_->node().waitForMembers(2, 20s).isOk());
  auto echo = remote_->remoteActor(2, "echo");
  Rng rng(11);
  for (uint64_t bytes : {uint64_t(0), uint64_t(1), uint64_t(4095), uint64_t(65536), uint64_t(1000003),
                         uint64_t(16) << 20}) {
    std::vector<uint8_t> data(bytes);
    for (auto& b : data) b = uint8_t(rng.next());
    Tensor sent = Tensor::copyOf(data.data(), bytes, DType::kBytes);
    auto reply = ask(echo, caf::make_message(echo_atom::value, sent), 30s);
    ASSERT_TRUE(reply.match_elements<Tensor>()) << bytes << ": " << caf::to_string(reply);
    const Tensor& got = reply.get_as<Tensor>(0);
    ASSERT_EQ(got.bytes, bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got.data) % 8, 0u) << "received tensors are 8-byte aligned";
    EXPECT_TRUE(bytes == 0 || std::memcmp(got.data, data.data(), bytes) == 0) << bytes << " bytes differ";
  }
}

TEST_F(TransportJob, MessagesFromOneSenderArriveInOrder) {
  spawnPeer("echo", 2);
  ASSERT_TRUE(remote_->node().waitForMembers(2, 20s).isOk());
  auto echo = remote_->remoteActor(2, "echo");
  caf::scoped_actor self{*system_};
  constexpr int64_t kMessages = 3000;
  for (int64_t i = 0; i < kMessages; ++i) {
    if (i % 100 == 7) {
      // Large ones go by rendezvous, small ones eagerly: order must hold across both.
      std::vector<int64_t> payload((size_t(1) << 20) / 8, i);
      self->send(echo, seq_atom::value, i, Tensor::adopt(std::move(payload), DType::kInt64));
    } else {
      self->send(echo, seq_atom::value, i);
    }
  }
  auto reply = ask(echo, caf::make_message(seqcheck_atom::value), 30s);
  ASSERT_TRUE((reply.match_elements<int64_t, bool>())) << caf::to_string(reply);
  EXPECT_EQ(reply.get_as<int64_t>(0), kMessages);
  EXPECT_TRUE(reply.get_as<bool>(1)) << "messages were reordered";
}

// Two nodes that first send to each other at the same moment both open a
// connection, and either side's handshake may finish first. Each node sends
// over the first of the two to be ready; what waited for its own one goes
// before anything sent after it (once, it went last: a replicated shard's
// backup took a BSP step before the one its primary took first). Pairs of
// fresh nodes, both bursting numbered messages at once: every message
// arrives, in order. Pairs are added until one of them sent frames held
// for its other connection (the case itself; every run here needed only
// the first 2 pairs, with 214-500 such frames), at least 2 and at most 8.
TEST_F(TransportJob, NodesThatConnectToEachOtherAtOnceKeepTheOrderOfTheirMessages) {
  constexpr int kMinPairs = 2, kMaxPairs = 8;
  constexpr int64_t kMessages = 2000;
  int64_t handedOver = 0;
  int pairs = 0;
  for (; pairs < kMaxPairs && (pairs < kMinPairs || handedOver == 0); ++pairs) {
    SCOPED_TRACE(pairs);
    const uint64_t a = uint64_t(2 + 2 * pairs), b = a + 1;
    spawnPeer("echo", a);
    spawnPeer("echo", b);
    ASSERT_TRUE(remote_->node().waitForMembers(3 + 2 * size_t(pairs), 30s).isOk());
    auto echoA = remote_->remoteActor(a, "echo"), echoB = remote_->remoteActor(b, "echo");
    caf::scoped_actor self{*system_};
    self->send(echoA, burst_atom::value, b, kMessages);
    self->send(echoB, burst_atom::value, a, kMessages);
    int bursts = 0;
    for (int i = 0; i < 2; ++i) {
      self->receive([&](int64_t n) { bursts += n == kMessages ? 1 : 0; },
                    caf::after(std::chrono::seconds(30)) >> [] {});
    }
    ASSERT_EQ(bursts, 2);
    for (const auto& echo : {echoA, echoB}) {
      // (The last messages may still be on their way: asked until all came, within a bound.)
      caf::message reply = seqCheckUntil(echo, kMessages, 200, 50ms);
      ASSERT_TRUE((reply.match_elements<int64_t, bool>())) << caf::to_string(reply);
      EXPECT_EQ(reply.get_as<int64_t>(0), kMessages);
      EXPECT_TRUE(reply.get_as<bool>(1)) << "messages were reordered";
      auto handed = ask(echo, caf::make_message(handed_atom::value));
      ASSERT_TRUE(handed.match_elements<int64_t>()) << caf::to_string(handed);
      handedOver += handed.get_as<int64_t>(0);
    }
  }
  EXPECT_GT(handedOver, 0) << "in " << pairs << " pairs no node held frames for a connection of its own "
                           << "while the other side's was ready: the case was not made";
  std::printf("%d pairs; frames handed over to the other connection: %lld\n", pairs,
              static_cast<long long>(handedOver));
}

TEST_F(TransportJob, ThreeProcessesTalkPeerToPeer) {
  spawnPeer("echo", 2);
  spawnPeer("echo", 3);
  ASSERT_TRUE(remote_->node().waitForMembers(3, 20s).isOk());
  // 2 asks 3 directly (an endpoint it opens from the membership it learnt).
  auto reply = ask(remote_->remoteActor(2, "echo"), caf::make_message(relay_atom::value, uint64_t(3), int64_t(20),
                                                                      int64_t(22)));
  ASSERT_TRUE(reply.match_elements<int64_t>()) << caf::to_string(reply);
  EXPECT_EQ(reply.get_as<int64_t>(0), 42);
  reply = ask(remote_->remoteActor(3, "echo"), caf::make_message(relay_atom::value, uint64_t(2), int64_t(1),
                                                                 int64_t(2)));
  ASSERT_TRUE(reply.match_elements<int64_t>()) << caf::to_string(reply);
  EXPECT_EQ(reply.get_as<int64_t>(0), 3);
  // Asking a node that is not in the job fails, it does not hang.
  reply = ask(remote_->remoteActor(2, "echo"), caf::make_message(relay_atom::value, uint64_t(99), int64_t(1),
                                                                 int64_t(2)));
  EXPECT_TRUE(reply.match_elements<caf::error>()) << caf::to_string(reply);
}

TEST_F(TransportJob, KilledPeerIsSeenByMonitorsAndFailsPendingRequests) {
  Child& child = spawnPeer("echo", 2);
  ASSERT_TRUE(remote_->node().waitForMembers(2, 20s).isOk());
  auto echo = remote_->remoteActor(2, "echo");
  ASSERT_EQ(caf::to_string(ask(echo, caf::make_message(add_atom::value, int64_t(1), int64_t(1)))), "(2)");
  caf::scoped_actor self{*system_};
  self->monitor(echo);
  // Requests the peer holds forever; each must fail when the peer dies. Two
  // requesters: their first requests carry the same (per-actor) request id.
  auto hold = [echo, client = caf::actor(self)](caf::event_based_actor* me) {
    me->request(echo, std::chrono::seconds(60), hold_atom::value)
        .then([=](caf::message&) { me->send(client, std::string("replied")); },
              [=](caf::error& e) { me->send(client, e); });
  };
  auto requester = system_->spawn(hold);
  auto requester2 = system_->spawn(hold);
  std::this_thread::sleep_for(200ms);  // the holds are on their way / held
  const auto killedAt = std::chrono::steady_clock::now();
  child.kill(SIGKILL);
  bool down = false;
  int failed = 0;
  caf::error reason;
  for (int i = 0; i < 3 && !(down && failed == 2); ++i) {
    self->receive([&](const caf::down_msg& m) {
                    down = m.source == echo.address();
                    reason = m.reason;
                  },
                  [&](const caf::error& e) { failed += e == caf::sec::request_receiver_down ? 1 : 0; },
                  [&](const std::string& s) { ADD_FAILURE() << s; },
                  caf::after(std::chrono::seconds(4)) >> [] {});
  }
  const auto took = std::chrono::steady_clock::now() - killedAt;
  EXPECT_TRUE(down) << "no down message for the killed peer's proxy";
  // On one host a killed peer is found by its wire-up socket (crashed) or
  // by the heartbeats (timed out), whichever comes first; never "left".
  const auto how = departureOf(reason);
  ASSERT_TRUE(how.has_value()) << caf::to_string(reason);
  EXPECT_TRUE(*how == Departure::kCrashed || *how == Departure::kTimedOut) << departureName(*how);
  EXPECT_EQ(failed, 2) << "pending requests that did not fail with request_receiver_down";
  // Within twice the heartbeat timeout (1 s).
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), 2000);
  // A request sent after the death fails at once.
  auto reply = ask(echo, caf::make_message(add_atom::value, int64_t(1), int64_t(1)), 5s);
  EXPECT_TRUE(reply.match_elements<caf::error>()) << caf::to_string(reply);
  // The coordinator's membership forgets the dead node.
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  while (remote_->node().members().size() != 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(remote_->node().members().size(), 1u);
  caf::anon_send_exit(requester, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(requester2, caf::exit_reason::user_shutdown);
}

TEST_F(TransportJob, FrozenPeerIsDeclaredDownWhenHeartbeatsStop) {
  Child& child = spawnPeer("echo", 2);
  ASSERT_TRUE(remote_->node().waitForMembers(2, 20s).isOk());
  auto echo = remote_->remoteActor(2, "echo");
  ASSERT_EQ(caf::to_string(ask(echo, caf::make_message(add_atom::value, int64_t(1), int64_t(2)))), "(3)");
  caf::scoped_actor self{*system_};
  self->monitor(echo);
  // SIGSTOP: the endpoint stays open, only the heartbeats stop.
  const auto stoppedAt = std::chrono::steady_clock::now();
  child.kill(SIGSTOP);
  bool down = false;
  caf::error reason;
  self->receive(
      [&](const caf::down_msg& m) {
        down = m.source == echo.address();
        reason = m.reason;
      },
      caf::after(std::chrono::seconds(4)) >> [] {});
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - stoppedAt);
  EXPECT_TRUE(down);
  EXPECT_EQ(departureOf(reason), Departure::kTimedOut) << caf::to_string(reason);
  // The heartbeat timeout is 1 s: seen after it, and within twice it.
  EXPECT_GE(took.count(), 900);
  EXPECT_LT(took.count(), 2000);
  child.kill(SIGKILL);
}

TEST_F(TransportJob, APeerThatQuitsIsSeenToLeave) {
  Child& child = spawnPeer("echo", 2);
  ASSERT_TRUE(remote_->node().waitForMembers(2, 20s).isOk());
  auto echo = remote_->remoteActor(2, "echo");
  caf::scoped_actor self{*system_};
  self->monitor(echo);
  ASSERT_EQ(caf::to_string(ask(echo, caf::make_message(quit_atom::value))), "(true)");
  caf::error reason;
  self->receive([&](const caf::down_msg& m) { reason = m.reason; }, caf::after(std::chrono::seconds(5)) >> [] {});
  EXPECT_EQ(departureOf(reason), Departure::kLeft) << caf::to_string(reason);
  EXPECT_EQ(child.wait(10s).exitCode, 0);
  // A proxy made after the departure is born dead, saying how the peer went.
  auto late = remote_->remoteActor(2, "echo");
  reason = caf::error();
  self->monitor(late);
  self->receive([&](const caf::down_msg& m) { reason = m.reason; }, caf::after(std::chrono::seconds(5)) >> [] {});
  EXPECT_EQ(departureOf(reason), Departure::kLeft) << caf::to_string(reason);
}

// Jobs in which a process is held stopped for a while on purpose: nobody
// (the coordinator here, the peers by their flag) takes it for silent then.
class LeavingJob : public TransportJob {
 protected:
  LeavingJob() { heartbeatTimeout_ = 5000ms; }
};

// A node that sends and then leaves (its process exits) while the receiver
// is not running: on one host the frames wait in the receiver's
// shared-memory queue, and the leaver's sockets close when it exits. The
// receiver must read every frame and the goodbye before it sees those
// sockets close (once, a rank that finished its last collective and exited
// failed a slower rank's wait for its last chunk: "connection reset").
TEST_F(LeavingJob, FramesSentJustBeforeAPeerLeavesAllArrive) {
  constexpr int64_t kMessages = 20;  // fewer than UCX's shared-memory queue holds
  // (Heartbeat timeouts longer than the receiver's stop: the sender's wait
  // ends on the answer, not on a verdict, and nobody is declared down.)
  Child& sender = spawnPeer("echo", 2, {"--heartbeat-timeout-ms", "5000"});
  Child& receiver = spawnPeer("echo", 3, {"--heartbeat-timeout-ms", "5000"});
  ASSERT_TRUE(remote_->node().waitForMembers(3, 20s).isOk());
  auto echoA = remote_->remoteActor(2, "echo"), echoB = remote_->remoteActor(3, "echo");
  // The sender's connection to the receiver, ready before the receiver stops.
  ASSERT_EQ(caf::to_string(ask(echoA, caf::make_message(burst_atom::value, uint64_t(3), kMessages))), "(20)");
  caf::message reply = seqCheckUntil(echoB, kMessages, 100, 20ms);
  ASSERT_EQ(caf::to_string(reply), "(20, true)");
  receiver.kill(SIGSTOP);
  ASSERT_EQ(caf::to_string(ask(echoA, caf::make_message(burst_atom::value, uint64_t(3), kMessages, kMessages))),
            "(20)");
  ASSERT_EQ(caf::to_string(ask(echoA, caf::make_message(quit_atom::value))), "(true)");
  std::this_thread::sleep_for(400ms);  // the sender is leaving meanwhile (its 100 ms, then its goodbye)
  receiver.kill(SIGCONT);
  EXPECT_EQ(sender.wait(10s).exitCode, 0);
  reply = ask(echoB, caf::make_message(seqcheck_atom::value));
  EXPECT_EQ(caf::to_string(reply), "(40, true)");
  // And the receiver took it for gone in order, not crashed.
  ASSERT_EQ(caf::to_string(ask(echoB, caf::make_message(quit_atom::value))), "(true)");
  EXPECT_EQ(receiver.wait(10s).exitCode, 0);
  const std::string log = troupe::testing::readFile(dir_.file("peer-3.log"));
  EXPECT_NE(log.find("node 2 left the job"), std::string::npos) << log;
  EXPECT_EQ(log.find("node 2 is down"), std::string::npos) << log;
  // The sender left on the answers to its goodbye, not at the end of its wait.
  const std::string senderLog = troupe::testing::readFile(dir_.file("peer-2.log"));
  EXPECT_EQ(senderLog.find("after this node's goodbye; leaving anyway"), std::string::npos) << senderLog;
  EXPECT_EQ(senderLog.find("is down"), std::string::npos) << senderLog;
}

// A leaving node waits for a stopped peer's answer to its goodbye only so
// long (1 s), then exits all the same.
TEST_F(LeavingJob, ALeavingNodeWaitsForAStoppedPeerOnlySoLong) {
  // (Its heartbeat timeout longer than the wait: the stopped peer is not
  // declared down before the wait is over.)
  Child& sender = spawnPeer("echo", 2, {"--heartbeat-timeout-ms", "5000"});
  Child& receiver = spawnPeer("echo", 3);
  ASSERT_TRUE(remote_->node().waitForMembers(3, 20s).isOk());
  auto echoA = remote_->remoteActor(2, "echo"), echoB = remote_->remoteActor(3, "echo");
  // The sender's connection to the receiver, ready (its 5 frames came).
  ASSERT_EQ(caf::to_string(ask(echoA, caf::make_message(burst_atom::value, uint64_t(3), int64_t(5)))), "(5)");
  const caf::message reply = seqCheckUntil(echoB, 5, 100, 20ms);
  ASSERT_EQ(caf::to_string(reply), "(5, true)");
  receiver.kill(SIGSTOP);
  const auto quitAt = std::chrono::steady_clock::now();
  ASSERT_EQ(caf::to_string(ask(echoA, caf::make_message(quit_atom::value))), "(true)");
  const auto done = sender.wait(10s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - quitAt).count();
  receiver.kill(SIGCONT);
  EXPECT_EQ(done.exitCode, 0) << "signal " << done.signal << "\n" << troupe::testing::readFile(dir_.file("peer-2.log"));
  EXPECT_GE(took, 1.0);  // its 100 ms, then the whole wait
  EXPECT_LT(took, 5.0);
  const std::string log = troupe::testing::readFile(dir_.file("peer-2.log"));
  EXPECT_NE(log.find("1 peer connection(s) still open 1000 ms after this node's goodbye; leaving anyway"),
            std::string::npos)
      << log;
}

// A node that leaves while its connection to a stopped peer is still being
// wired up (its hello waits in UCX) exits in order: before, UCX aborted the
// process as the node destroyed its worker ("pending request ... should
// have been flushed", SIGABRT).
TEST_F(LeavingJob, ANodeLeavingMidHandshakeWithAStoppedPeerExitsInOrder) {
  // (Its handshake timeout, the heartbeat timeout here, longer than the
  // test: the hello is still waiting when the node goes.)
  Child& sender = spawnPeer("echo", 2, {"--heartbeat-timeout-ms", "5000"});
  Child& receiver = spawnPeer("echo", 3);
  ASSERT_TRUE(remote_->node().waitForMembers(3, 20s).isOk());
  auto echoA = remote_->remoteActor(2, "echo");
  receiver.kill(SIGSTOP);
  // The first frame opens the sender's connection; the stopped receiver
  // never answers its hello.
  ASSERT_EQ(caf::to_string(ask(echoA, caf::make_message(burst_atom::value, uint64_t(3), int64_t(5)))), "(5)");
  ASSERT_EQ(caf::to_string(ask(echoA, caf::make_message(quit_atom::value))), "(true)");
  const auto done = sender.wait(10s);
  receiver.kill(SIGCONT);
  const std::string log = troupe::testing::readFile(dir_.file("peer-2.log"));
  EXPECT_EQ(done.exitCode, 0) << "signal " << done.signal << "\n" << log;
  EXPECT_NE(log.find("sends to a peer never finished, so its UCX worker is left to the process's exit"),
            std::string::npos)
      << log;
  // (It waited for the handshake that held its frames, and no longer.)
  EXPECT_NE(log.find("1 peer connection(s) still open 1000 ms after this node's goodbye; leaving anyway"),
            std::string::npos)
      << log;
}

// Frames a node sent to a peer it had no connection with yet wait for the
// handshake; a node that leaves meanwhile waits for it (within its bound)
// and they go, its goodbye after them.
TEST_F(LeavingJob, FramesHeldForAHandshakeStillRunningGoBeforeTheNodeLeaves) {
  Child& sender = spawnPeer("echo", 2, {"--heartbeat-timeout-ms", "5000"});
  Child& receiver = spawnPeer("echo", 3, {"--heartbeat-timeout-ms", "5000"});
  ASSERT_TRUE(remote_->node().waitForMembers(3, 20s).isOk());
  auto echoA = remote_->remoteActor(2, "echo"), echoB = remote_->remoteActor(3, "echo");
  receiver.kill(SIGSTOP);
  ASSERT_EQ(caf::to_string(ask(echoA, caf::make_message(burst_atom::value, uint64_t(3), int64_t(5)))), "(5)");
  ASSERT_EQ(caf::to_string(ask(echoA, caf::make_message(quit_atom::value))), "(true)");
  // The sender is leaving meanwhile: its 100 ms, its goodbyes, up to 500 ms
  // for its sends (the hello among them), then the wait for the handshake.
  std::this_thread::sleep_for(800ms);
  receiver.kill(SIGCONT);
  const auto done = sender.wait(10s);
  const std::string log = troupe::testing::readFile(dir_.file("peer-2.log"));
  EXPECT_EQ(done.exitCode, 0) << "signal " << done.signal << "\n" << log;
  EXPECT_EQ(log.find("leaving anyway"), std::string::npos) << log;
  EXPECT_EQ(caf::to_string(ask(echoB, caf::make_message(seqcheck_atom::value))), "(5, true)");
}

// A message sent while this process's transport is closing (here held
// open by a stopped peer's unanswered goodbye) fails its requester and is
// no error in the log: the job is ending (after Ctrl-C, replies in flight
// logged "cannot send ... the transport is shut down" at error level).
TEST_F(LeavingJob, AMessageSentAsTheTransportClosesFailsQuietly) {
  const std::string logPath = dir_.file("coordinator.log");
  addLogFile(logPath);
  Child& peer = spawnPeer("echo", 2, {"--heartbeat-timeout-ms", "5000"});
  ASSERT_TRUE(remote_->node().waitForMembers(2, 20s).isOk());
  auto echo = remote_->remoteActor(2, "echo");
  ASSERT_EQ(caf::to_string(ask(echo, caf::make_message(add_atom::value, int64_t(1), int64_t(2)))), "(3)");
  peer.kill(SIGSTOP);
  std::thread closing([this] { remote_.reset(); });  // waits 1 s for the stopped peer's answer
  std::this_thread::sleep_for(300ms);
  auto reply = ask(echo, caf::make_message(add_atom::value, int64_t(1), int64_t(2)), 5s);
  closing.join();
  peer.kill(SIGCONT);
  ASSERT_TRUE(reply.match_elements<caf::error>()) << caf::to_string(reply);
  EXPECT_NE(caf::to_string(reply).find("the transport is shut down"), std::string::npos) << caf::to_string(reply);
  const std::string log = troupe::testing::readFile(logPath);
  EXPECT_EQ(log.find("cannot send"), std::string::npos) << log;
}

TEST_F(TransportJob, WrongTokenIsRefusedAndTheCoordinatorKeepsServing) {
  Child& bad = spawnPeer("badtoken", 5, {"--token", "not-the-token"});
  auto r = bad.wait(20s);
  EXPECT_EQ(r.exitCode, 0) << "a peer with the wrong token got in, or failed oddly:\n" << r.err;
  // The peer found the coordinator's proof wrong and said so: counted here.
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (remote_->node().stats().handshakesRefused < 1 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(remote_->node().stats().handshakesRefused, 1u);
  EXPECT_EQ(remote_->node().members().size(), 1u);
  spawnPeer("echo", 2);
  ASSERT_TRUE(remote_->node().waitForMembers(2, 20s).isOk());
  EXPECT_EQ(caf::to_string(ask(remote_->remoteActor(2, "echo"),
                               caf::make_message(add_atom::value, int64_t(2), int64_t(3)))),
            "(5)");
}

TEST_F(TransportJob, IdleConnectionsDoNotDelayARealJoin) {
  using std::chrono::milliseconds;
  const milliseconds deadline = NodeOptions{}.handshakeTimeout;  // the coordinator's
  const size_t perHost = NodeOptions{}.maxHandshakingPerHost;
  auto timeJoin = [&](uint64_t id, size_t members) {
    const auto t0 = std::chrono::steady_clock::now();
    spawnPeer("echo", id);
    EXPECT_TRUE(remote_->node().waitForMembers(members, 20s).isOk());
    return std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
  };
  const milliseconds alone = timeJoin(2, 2);
  // 100 TCP connections to the listening port that send nothing (UCX's own
  // connection set-up never completes) ...
  struct Sockets {
    std::vector<int> fds;
    ~Sockets() {
      for (int fd : fds) ::close(fd);
    }
  } sockets;
  for (int i = 0; i < 100; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockets.fds.push_back(fd);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(remote_->node().port());
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin), 0) << std::strerror(errno);
  }
  // ... and UCX connections that send nothing, each taking a handshake
  // slot: 200 at once, then one every 10 ms for 4 s, so that this host's
  // slots are full when the real worker comes.
  const std::string opened = dir_.file("idle.count");
  Child& idle = spawnPeer("idle", 9, {"--count", "200", "--port-file", opened, "--lifetime-ms", "4000"});
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (!std::filesystem::exists(opened) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(std::filesystem::exists(opened)) << "the idle peer did not open its connections in 30 s";
  size_t first = 0;
  std::ifstream(opened) >> first;
  ASSERT_EQ(first, 200u);
  // This host's slots are full (the rest of the 200 were closed for room,
  // refused or timed out) once the coordinator has seen the requests.
  auto ended = [&] {
    const NodeStats s = remote_->node().stats();
    return s.idleClosed + s.handshakesTimedOut + s.handshakesRefused + s.handshakesAbandoned;
  };
  while (ended() < 200 - perHost && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(5ms);
  ASSERT_GE(ended(), 200 - perHost) << "this host's slots are not full";
  const milliseconds attacked = timeJoin(3, 3);
  EXPECT_LT(attacked, alone + deadline) << "alone " << alone.count() << " ms, beside idle connections "
                                        << attacked.count() << " ms";
  // Every connection request that reached the coordinator ends once,
  // counted: through the handshake (the two workers'), closed for a newer
  // one, refused (every slot held by one too young to close), timed out, or
  // abandoned (the idle peer closed those it still had when it exited).
  ASSERT_EQ(idle.wait(30s).exitCode, 0);
  size_t total = 0;
  std::ifstream(opened + ".total") >> total;
  ASSERT_GT(total, 200u);
  const auto settle = std::chrono::steady_clock::now() + deadline + 5s;
  while (ended() + 2 < remote_->node().stats().connectionRequests && std::chrono::steady_clock::now() < settle) {
    std::this_thread::sleep_for(10ms);
  }
  const NodeStats after = remote_->node().stats();
  logger("tests")->info("join alone {} ms, beside idle connections {} ms; {} idle connections opened, {} requests "
                        "reached the coordinator: {} closed for newer ones, {} refused, {} timed out, {} abandoned",
                        alone.count(), attacked.count(), total, after.connectionRequests, after.idleClosed,
                        after.handshakesRefused, after.handshakesTimedOut, after.handshakesAbandoned);
  EXPECT_EQ(after.idleClosed + after.handshakesTimedOut + after.handshakesRefused + after.handshakesAbandoned + 2,
            after.connectionRequests);
  // (An endpoint the idle peer made may not have reached the coordinator
  // before the peer closed it; none came from elsewhere.)
  EXPECT_LE(after.connectionRequests, total + 2);
  EXPECT_GE(after.connectionRequests, 200u + 2);
  EXPECT_GT(after.idleClosed, 0u);  // room was made by closing idle ones
  EXPECT_EQ(remote_->node().members().size(), 3u);
  EXPECT_EQ(caf::to_string(ask(remote_->remoteActor(3, "echo"),
                               caf::make_message(add_atom::value, int64_t(2), int64_t(3)))),
            "(5)");
}

TEST_F(TransportJob, GarbageIsCountedAndDroppedWithoutACrash) {
  spawnPeer("echo", 2);
  ASSERT_TRUE(remote_->node().waitForMembers(2, 20s).isOk());
  auto echo = remote_->remoteActor(2, "echo");
  // Raw bytes at the listening socket (not UCX at all).
  for (int i = 0; i < 5; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(remote_->node().port());
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sin), sizeof sin) == 0) {
      std::vector<uint8_t> junk(4096);
      Rng rng(uint64_t(i) + 1);
      for (auto& b : junk) b = uint8_t(rng.next());
      [[maybe_unused]] ssize_t n = ::write(fd, junk.data(), junk.size());
    }
    ::close(fd);
  }
  // Malformed frames from an authenticated peer.
  const uint64_t before = remote_->node().stats().malformedDropped + remote_->stats().undeliverable;
  auto reply = ask(echo, caf::make_message(garbage_atom::value, kCoordinatorId));
  ASSERT_TRUE(reply.match_elements<int64_t>()) << caf::to_string(reply);
  const int64_t sent = reply.get_as<int64_t>(0);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  uint64_t dropped = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    dropped = remote_->node().stats().malformedDropped + remote_->stats().undeliverable - before;
    if (dropped >= uint64_t(sent)) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(dropped, uint64_t(sent));
  // Still serving, both ways.
  EXPECT_EQ(caf::to_string(ask(echo, caf::make_message(add_atom::value, int64_t(7), int64_t(8)))), "(15)");
}

class SmallFrameJob : public TransportJob {
 protected:
  SmallFrameJob() { maxFrameBytes_ = uint64_t{1} << 20; }
};

TEST_F(SmallFrameJob, OversizedMessageIsDroppedAndCounted) {
  spawnPeer("echo", 2);
  ASSERT_TRUE(remote_->node().waitForMembers(2, 20s).isOk());
  auto echo = remote_->remoteActor(2, "echo");
  // 2 MiB goes out fine; the echo coming back is over this node's 1 MiB limit.
  std::vector<uint8_t> big(size_t(2) << 20, 7);
  auto reply = ask(echo, caf::make_message(echo_atom::value, Tensor::copyOf(big.data(), big.size())), 2s);
  EXPECT_TRUE(reply.match_elements<caf::error>()) << caf::to_string(reply);  // timed out: never delivered
  EXPECT_GE(remote_->node().stats().malformedDropped, 1u);
  // Still serving.
  EXPECT_EQ(caf::to_string(ask(echo, caf::make_message(add_atom::value, int64_t(1), int64_t(1)))), "(2)");
}

}  // namespace
}  // namespace troupe::transport::testing

int main(int argc, char** argv) {
  const int peer = troupe::transport::testing::runPeerIfAsked(argc, argv);
  if (peer >= 0) return peer;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
