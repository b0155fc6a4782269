// The in-process transport (transport/local_network.h): membership, order,
// refusal, and the three ways a peer goes (goodbye, crash, freeze), each
// counted exactly; then remote actors over it, as over UCX.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include "transport/link_faults.h"
#include "transport/local_network.h"
#include "transport/remote_actors.h"

namespace troupe::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Records what a node delivers.
class Recorder : public NodeHandler {
 public:
  void onFrame(uint64_t peer, DecodedFrame frame, std::shared_ptr<const void>) override {
    std::lock_guard<std::mutex> lock(mu);
    Got g{peer, frame.envelope.kind, frame.envelope.body, {}};
    for (const auto& t : frame.tensors) g.tensor.assign(t.data, t.data + t.bytes);
    frames.push_back(std::move(g));
    cv.notify_all();
  }
  void onPeerDown(uint64_t peer, Departure how, const Status&) override {
    std::lock_guard<std::mutex> lock(mu);
    downs.emplace_back(peer, how);
    cv.notify_all();
  }
  template <typename Pred>
  bool waitFor(Pred pred, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return pred(); });
  }
  size_t downsOf(uint64_t peer) {
    std::lock_guard<std::mutex> lock(mu);
    size_t n = 0;
    for (auto& d : downs) n += d.first == peer;
    return n;
  }

  struct Got {
    uint64_t peer;
    uint16_t kind;
    std::string body;
    std::vector<std::byte> tensor;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Got> frames;
  std::vector<std::pair<uint64_t, Departure>> downs;
};

class LocalNetworkTest : public ::testing::Test {
 protected:
  std::unique_ptr<Node> start(uint64_t id, Recorder* r, bool coordinator = false, std::string token = "test-token") {
    NodeOptions o;
    o.nodeId = id;
    o.role = coordinator ? "coordinator" : "node";
    o.token = std::move(token);
    o.isCoordinator = coordinator;
    if (!coordinator) o.coordinator = coordinatorAddress;
    o.heartbeatInterval = heartbeatInterval;
    o.heartbeatTimeout = heartbeatTimeout;
    o.joinTimeout = 2s;
    o.network = net;
    o.linkFaults = faults;
    o.reliableLinks = reliable;
    auto n = Node::start(o, r);
    EXPECT_TRUE(n.hasValue()) << n.status().message();
    if (!n.hasValue()) return nullptr;
    if (coordinator) coordinatorAddress = (*n)->address();
    return std::move(*n);
  }
  static Envelope env(uint16_t kind, std::string body) {
    Envelope e;
    e.kind = kind;
    e.body = std::move(body);
    return e;
  }

  std::shared_ptr<LocalNetwork> net = LocalNetwork::create();
  std::string coordinatorAddress;
  std::shared_ptr<LinkFaults> faults;  // given to the nodes start() makes
  bool reliable = false;
  std::chrono::milliseconds heartbeatInterval{50}, heartbeatTimeout{400};
};

TEST_F(LocalNetworkTest, MembersJoinAndFramesArriveInOrderWithTheirTensors) {
  Recorder rc, r2, r3;
  auto c = start(1, &rc, true);
  auto a = start(2, &r2);
  auto b = start(3, &r3);
  ASSERT_TRUE(c->waitForMembers(3, 5s).isOk());
  ASSERT_TRUE(a->waitForMembers(3, 5s).isOk());
  ASSERT_TRUE(b->waitForMembers(3, 5s).isOk());
  EXPECT_EQ(net->nodes(), (std::vector<uint64_t>{1, 2, 3}));

  constexpr int kFrames = 2000;
  std::vector<float> values(1000);
  for (int i = 0; i < kFrames; ++i) {
    for (size_t k = 0; k < values.size(); ++k) values[k] = float(i) + float(k) / 1000.0f;
    auto owner = std::make_shared<std::vector<float>>(values);
    Tensor t;
    t.data = reinterpret_cast<const std::byte*>(owner->data());
    t.bytes = owner->size() * sizeof(float);
    t.dtype = DType::kFloat32;
    t.owner = owner;
    a->send(3, env(kFirstUserKind + 1, std::to_string(i)), {t});
  }
  ASSERT_TRUE(r3.waitFor([&] { return r3.frames.size() == kFrames; }));
  for (int i = 0; i < kFrames; ++i) {
    const auto& g = r3.frames[size_t(i)];
    ASSERT_EQ(g.peer, 2u);
    ASSERT_EQ(g.body, std::to_string(i));
    ASSERT_EQ(g.tensor.size(), 4000u);
    float first, last;
    std::memcpy(&first, g.tensor.data(), 4);
    std::memcpy(&last, g.tensor.data() + 3996, 4);
    ASSERT_EQ(first, float(i));
    ASSERT_EQ(last, float(i) + 0.999f);
  }
  EXPECT_EQ(b->stats().framesReceived, uint64_t(kFrames));
  EXPECT_EQ(a->stats().framesSent, uint64_t(kFrames));
  // A goodbye: both others see node 2 leave, once; the coordinator drops it.
  a.reset();
  ASSERT_TRUE(rc.waitFor([&] { return rc.downs.size() == 1; }));
  ASSERT_TRUE(r3.waitFor([&] { return r3.downs.size() == 1; }));
  EXPECT_EQ(rc.downs[0], std::make_pair(uint64_t(2), Departure::kLeft));
  EXPECT_EQ(r3.downs[0], std::make_pair(uint64_t(2), Departure::kLeft));
  ASSERT_TRUE(r3.waitFor([&] { return b->members().size() == 2; }, 5s));
  // Sending to it now fails with how it went.
  b->send(2, env(kFirstUserKind, "late"), {});
  ASSERT_TRUE(r3.waitFor([&] { return r3.downs.size() == 2; }));
  EXPECT_EQ(r3.downs[1], std::make_pair(uint64_t(2), Departure::kLeft));
}

TEST_F(LocalNetworkTest, AnotherJobsTokenIsRefusedAndJoiningFailsNamingIt) {
  Recorder rc, r2;
  auto c = start(1, &rc, true);
  auto stranger = start(2, &r2, false, "another-token");
  Status s = stranger->waitForMembers(2, 5s);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("wrong job token"), std::string::npos) << s.message();
  EXPECT_EQ(c->stats().handshakesRefused, 1u);
  EXPECT_EQ(c->members().size(), 1u);
  // And a frame it tries to send is refused, not delivered.
  stranger->send(1, env(kFirstUserKind, "hello"), {});
  ASSERT_TRUE(r2.waitFor([&] { return r2.downs.size() == 1; }));
  EXPECT_EQ(r2.downs[0].second, Departure::kRefused);
  EXPECT_TRUE(rc.frames.empty());
  // Nobody at an address: joining ends with an error within joinTimeout.
  coordinatorAddress = "127.0.0.1:9";
  Recorder r3;
  auto lost = start(3, &r3);
  const auto t0 = Clock::now();
  s = lost->waitForMembers(2, 10s);
  EXPECT_FALSE(s.isOk());
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_NE(s.message().find("nobody listens"), std::string::npos) << s.message();
}

TEST_F(LocalNetworkTest, ACrashIsSeenOnceByEveryLinkedPeerAndByTheCrashedNode) {
  Recorder rc, r2, r3;
  auto c = start(1, &rc, true);
  auto a = start(2, &r2);
  auto b = start(3, &r3);
  ASSERT_TRUE(c->waitForMembers(3, 5s).isOk());
  ASSERT_TRUE(b->waitForMembers(3, 5s).isOk());
  b->send(2, env(kFirstUserKind, "x"), {});
  ASSERT_TRUE(r2.waitFor([&] { return r2.frames.size() == 1; }));
  ASSERT_TRUE(net->crash(3));
  EXPECT_FALSE(net->crash(3));
  ASSERT_TRUE(rc.waitFor([&] { return rc.downs.size() == 1; }));
  ASSERT_TRUE(r2.waitFor([&] { return r2.downs.size() == 1; }));
  EXPECT_EQ(rc.downs[0], std::make_pair(uint64_t(3), Departure::kCrashed));
  EXPECT_EQ(r2.downs[0], std::make_pair(uint64_t(3), Departure::kCrashed));
  // The crashed node saw both its links go.
  ASSERT_TRUE(r3.waitFor([&] { return r3.downs.size() == 2; }));
  EXPECT_EQ(r3.downsOf(1), 1u);
  EXPECT_EQ(r3.downsOf(2), 1u);
  ASSERT_TRUE(rc.waitFor([&] { return c->members().size() == 2; }, 5s));
  // It sends nothing more; nothing reaches it.
  b->send(2, env(kFirstUserKind, "ghost"), {});
  a->send(3, env(kFirstUserKind, "to the dead"), {});
  ASSERT_TRUE(r2.waitFor([&] { return r2.downs.size() == 2; }));
  EXPECT_EQ(r2.downs[1].second, Departure::kCrashed);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(r2.frames.size(), 1u);
  EXPECT_EQ(rc.downsOf(3), 1u);
}

TEST_F(LocalNetworkTest, AFrozenNodeIsTimedOutAndFindsItselfFencedWhenThawed) {
  Recorder rc, r2, r3;
  auto c = start(1, &rc, true);
  auto a = start(2, &r2);
  auto b = start(3, &r3);
  ASSERT_TRUE(b->waitForMembers(3, 5s).isOk());
  a->send(3, env(kFirstUserKind, "before"), {});
  ASSERT_TRUE(r3.waitFor([&] { return r3.frames.size() == 1; }));
  const auto t0 = Clock::now();
  ASSERT_TRUE(net->freeze(3));
  b->send(2, env(kFirstUserKind, "while frozen"), {});  // waits with the node
  ASSERT_TRUE(r2.waitFor([&] { return r2.downs.size() == 1; }, 5s));
  const auto found = Clock::now() - t0;
  EXPECT_EQ(r2.downs[0], std::make_pair(uint64_t(3), Departure::kTimedOut));
  // Found after the heartbeat timeout (400 ms) and within twice it.
  EXPECT_GE(found, 400ms);
  EXPECT_LE(found, 800ms + 400ms);
  ASSERT_TRUE(rc.waitFor([&] { return rc.downs.size() == 1; }, 5s));
  EXPECT_EQ(rc.downs[0], std::make_pair(uint64_t(3), Departure::kTimedOut));
  EXPECT_TRUE(r3.downs.empty());  // it handles nothing while frozen
  ASSERT_TRUE(net->thaw(3));
  // Thawed, it finds both links closed; what it sent while frozen is not
  // let in.
  auto sawBoth = [&] {
    bool one = false, two = false;
    for (auto& d : r3.downs) {
      one = one || d.first == 1;
      two = two || d.first == 2;
    }
    return one && two;
  };
  ASSERT_TRUE(r3.waitFor(sawBoth, 5s));
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(r3.downsOf(1), 1u);
  // Node 2 once as a closed link, and once more if the send held while
  // frozen went after that (a send to a peer that is down reports it).
  EXPECT_GE(r3.downsOf(2), 1u);
  EXPECT_LE(r3.downsOf(2), 2u);
  EXPECT_EQ(r2.frames.size(), 0u);
  EXPECT_EQ(r2.downs.size(), 1u);
}

// Message faults, each on the reliable links of the twin: node 2
// ("worker:0") sends kFrames numbered frames to node 3 ("ps:0"); every
// one must arrive exactly once and in order, and the counts of what was
// injected and what the links did about it must agree.
struct LinkRun {
  std::vector<std::string> bodies;  // as node 3 got them
  NodeStats sender, receiver;
  std::vector<uint64_t> injected;
  std::set<uint64_t> firstSendsHit;  // frames hit on their first send
};

class LinkFaultTest : public LocalNetworkTest {
 protected:
  static constexpr int kFrames = 400;

  LinkRun run(LinkFaultRule rule, uint64_t seed) {
    net = LocalNetwork::create();
    faults = std::make_shared<LinkFaults>(seed, std::vector<LinkFaultRule>{rule});
    faults->name(2, "worker:0");
    faults->name(3, "ps:0");
    Recorder rc, r2, r3;
    auto c = start(1, &rc, true);
    auto a = start(2, &r2);
    auto b = start(3, &r3);
    EXPECT_TRUE(b->waitForMembers(3, 5s).isOk());
    std::vector<uint8_t> payload(256);
    for (int i = 0; i < kFrames; ++i) {
      for (size_t k = 0; k < payload.size(); ++k) payload[k] = uint8_t(i + k);
      a->send(3, env(kFirstUserKind, std::to_string(i)), {Tensor::copyOf(payload.data(), payload.size())});
    }
    EXPECT_TRUE(r3.waitFor([&] { return r3.frames.size() >= size_t(kFrames); }, 20s))
        << r3.frames.size() << " of " << kFrames << " arrived";
    std::this_thread::sleep_for(100ms);  // anything doubled would show by now
    LinkRun out;
    {
      std::lock_guard<std::mutex> lock(r3.mu);
      for (auto& g : r3.frames) {
        out.bodies.push_back(g.body);
        bool intact = g.tensor.size() == payload.size();
        const int i = std::atoi(g.body.c_str());
        for (size_t k = 0; intact && k < g.tensor.size(); ++k) intact = g.tensor[k] == std::byte(uint8_t(i + k));
        EXPECT_TRUE(intact) << "frame " << g.body << "'s tensor changed on the way";
      }
    }
    out.sender = a->stats();
    out.receiver = b->stats();
    out.injected = faults->injected();
    for (const auto& h : faults->hits()) {
      if (h.attempt == 1) out.firstSendsHit.insert(h.seq);
    }
    EXPECT_TRUE(r2.downs.empty() && r3.downs.empty()) << "a link was lost";
    return out;
  }

  static std::vector<std::string> inOrder() {
    std::vector<std::string> v;
    for (int i = 0; i < kFrames; ++i) v.push_back(std::to_string(i));
    return v;
  }
  static LinkFaultRule rule(LinkFaultKind kind, double p) {
    LinkFaultRule r;
    r.kind = kind;
    r.from = "worker";
    r.to = "ps:0";
    r.probability = p;
    return r;
  }
};

TEST_F(LinkFaultTest, DroppedFramesAreSentAgainAndArriveOnceInOrder) {
  LinkRun x = run(rule(LinkFaultKind::kDrop, 0.1), 7);
  EXPECT_EQ(x.bodies, inOrder());
  // 400 frames at 10%: some dropped (first sends and resends alike), each
  // one sent again until it got through.
  EXPECT_GT(x.sender.faultsDropped, 15u);
  EXPECT_LT(x.sender.faultsDropped, 80u);
  EXPECT_EQ(x.injected[0], x.sender.faultsDropped);
  EXPECT_GE(x.sender.framesResent, x.sender.faultsDropped);
  EXPECT_GE(x.receiver.gapsFound, 1u);
  // The same seed drops the same frames; another seed others.
  LinkRun again = run(rule(LinkFaultKind::kDrop, 0.1), 7);
  EXPECT_EQ(again.bodies, inOrder());
  EXPECT_GT(x.firstSendsHit.size(), 15u);
  EXPECT_EQ(again.firstSendsHit, x.firstSendsHit);
  LinkRun other = run(rule(LinkFaultKind::kDrop, 0.1), 8);
  EXPECT_EQ(other.bodies, inOrder());
  EXPECT_NE(other.firstSendsHit, x.firstSendsHit);
}

// An exchange in lockstep (each frame waits for the one before to arrive,
// as a reply waits for its request): a dropped frame has nothing behind it
// to show the gap, and heartbeats are 2 s apart here. The sender probes
// 50 ms on (backing off: an ack of its own, saying what it sent), the
// receiver asks for the frame again, so the drops cost milliseconds.
TEST_F(LinkFaultTest, ALostLastFrameIsProbedAgainWithoutWaitingForAHeartbeat) {
  heartbeatInterval = 2s;
  heartbeatTimeout = 20s;
  net = LocalNetwork::create();
  faults = std::make_shared<LinkFaults>(5, std::vector<LinkFaultRule>{rule(LinkFaultKind::kDrop, 0.3)});
  faults->name(2, "worker:0");
  faults->name(3, "ps:0");
  reliable = true;
  Recorder rc, r2, r3;
  auto c = start(1, &rc, true);
  auto a = start(2, &r2);
  auto b = start(3, &r3);
  ASSERT_TRUE(b->waitForMembers(3, 5s).isOk());
  constexpr int kExchanges = 20;
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < kExchanges; ++i) {
    a->send(3, env(kFirstUserKind, std::to_string(i)), {});
    ASSERT_TRUE(r3.waitFor([&] { return r3.frames.size() >= size_t(i + 1); }, 10s)) << "frame " << i;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  const NodeStats s = a->stats();
  EXPECT_GE(s.faultsDropped, 3u) << "the seed drops some";
  // Each drop waited 50 ms and a resend request, or a little more (twice
  // that for a second drop of the same frame), not a heartbeat's 2 s.
  EXPECT_LT(seconds, 1.9) << s.faultsDropped << " dropped";
  EXPECT_GE(s.framesResent, s.faultsDropped);
  std::vector<std::string> bodies;
  {
    std::lock_guard<std::mutex> lock(r3.mu);
    for (const auto& g : r3.frames) bodies.push_back(g.body);
  }
  std::vector<std::string> want;
  for (int i = 0; i < kExchanges; ++i) want.push_back(std::to_string(i));
  EXPECT_EQ(bodies, want);
}

TEST_F(LinkFaultTest, DuplicatedFramesAreSuppressedOneForOne) {
  LinkRun x = run(rule(LinkFaultKind::kDuplicate, 0.2), 3);
  EXPECT_EQ(x.bodies, inOrder());
  EXPECT_GT(x.sender.faultsDuplicated, 40u);
  // Each doubled frame arrived twice and was suppressed once (a resend
  // asked for on a gap a heartbeat showed early adds its own).
  EXPECT_GE(x.receiver.duplicatesSuppressed, x.sender.faultsDuplicated);
  EXPECT_LE(x.receiver.duplicatesSuppressed, x.sender.faultsDuplicated + x.sender.framesResent);
  EXPECT_EQ(x.receiver.framesReceived, uint64_t(kFrames));
}

TEST_F(LinkFaultTest, DelayedFramesWaitAndTheOnesBehindThemWaitForThem) {
  LinkFaultRule r = rule(LinkFaultKind::kDelay, 0.05);
  r.delayMin = 2ms;
  r.delayMax = 30ms;
  LinkRun x = run(r, 11);
  EXPECT_EQ(x.bodies, inOrder());
  EXPECT_GT(x.sender.faultsDelayed, 5u);
  EXPECT_GE(x.receiver.framesHeldOutOfOrder, 1u);
}

TEST_F(LinkFaultTest, ReorderedFramesAreHandedOnInOrder) {
  LinkRun x = run(rule(LinkFaultKind::kReorder, 0.1), 5);
  EXPECT_EQ(x.bodies, inOrder());
  EXPECT_GT(x.sender.faultsReordered, 15u);
  // Each one held back arrived after the frame that overtook it.
  EXPECT_GE(x.receiver.framesHeldOutOfOrder, x.sender.faultsReordered - 1);
}

TEST_F(LinkFaultTest, CorruptedFramesAreRefusedOneForOneAndSentAgain) {
  LinkRun x = run(rule(LinkFaultKind::kCorrupt, 0.1), 9);
  EXPECT_EQ(x.bodies, inOrder());
  EXPECT_GT(x.sender.faultsCorrupted, 15u);
  EXPECT_EQ(x.receiver.malformedDropped, x.sender.faultsCorrupted);
  EXPECT_GE(x.sender.framesResent, x.sender.faultsCorrupted);
}

TEST_F(LinkFaultTest, APartitionCutsBothWaysAndIsFoundByHeartbeats) {
  reliable = true;
  LinkFaultRule r;
  r.kind = LinkFaultKind::kPartition;
  r.from = "worker:0";
  r.to = "ps:0";
  r.startSeconds = 0.5;
  net = LocalNetwork::create();
  faults = std::make_shared<LinkFaults>(1, std::vector<LinkFaultRule>{r});
  faults->name(2, "worker:0");
  faults->name(3, "ps:0");
  Recorder rc, r2, r3;
  auto c = start(1, &rc, true);
  auto a = start(2, &r2);
  auto b = start(3, &r3);
  ASSERT_TRUE(b->waitForMembers(3, 5s).isOk());
  a->send(3, env(kFirstUserKind, "before"), {});
  b->send(2, env(kFirstUserKind, "before"), {});
  ASSERT_TRUE(r3.waitFor([&] { return r3.frames.size() == 1; }));
  ASSERT_TRUE(r2.waitFor([&] { return r2.frames.size() == 1; }));
  // Cut from 0.5 s: each side times the other out (400 ms), once; the
  // coordinator, outside the cut, loses neither.
  ASSERT_TRUE(r2.waitFor([&] { return r2.downs.size() == 1; }, 5s));
  ASSERT_TRUE(r3.waitFor([&] { return r3.downs.size() == 1; }, 5s));
  EXPECT_EQ(r2.downs[0].first, 3u);
  EXPECT_EQ(r3.downs[0].first, 2u);
  EXPECT_TRUE(r2.downs[0].second == Departure::kTimedOut || r2.downs[0].second == Departure::kCrashed);
  EXPECT_TRUE(r3.downs[0].second == Departure::kTimedOut || r3.downs[0].second == Departure::kCrashed);
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(rc.downs.empty());
  EXPECT_EQ(c->members().size(), 3u);
  EXPECT_GT(a->stats().faultsPartitioned + b->stats().faultsPartitioned, 0u);
}

// Remote actors over the twin: request, reply, and a monitor that sees the
// peer crash, across two actor systems in one process.
using add_atom = caf::atom_constant<caf::atom("add")>;

TEST_F(LocalNetworkTest, RemoteActorsWorkOverTheTwin) {
  caf::actor_system_config c1, c2;
  c1.set("scheduler.max-threads", 2);
  c2.set("scheduler.max-threads", 2);
  caf::actor_system s1{c1}, s2{c2};
  NodeOptions o;
  o.token = "test-token";
  o.heartbeatInterval = 50ms;
  o.heartbeatTimeout = 400ms;
  o.network = net;
  o.nodeId = 1;
  o.isCoordinator = true;
  auto r1 = RemoteActors::start(s1, o);
  ASSERT_TRUE(r1.hasValue()) << r1.status().message();
  o.nodeId = 2;
  o.isCoordinator = false;
  o.coordinator = (*r1)->node().address();
  auto r2 = RemoteActors::start(s2, o);
  ASSERT_TRUE(r2.hasValue()) << r2.status().message();
  ASSERT_TRUE((*r2)->node().waitForMembers(2, 5s).isOk());
  auto adder = s2.spawn([]() -> caf::behavior { return {[](add_atom, int64_t a, int64_t b) { return a + b; }}; });
  (*r2)->publish(adder, "adder");
  auto proxy = (*r1)->remoteActor(2, "adder");
  caf::scoped_actor self{s1};
  int64_t sum = 0;
  self->request(proxy, 5s, add_atom::value, int64_t(40), int64_t(2))
      .receive([&](int64_t v) { sum = v; }, [&](caf::error& e) { ADD_FAILURE() << s1.render(e); });
  EXPECT_EQ(sum, 42);
  self->monitor(proxy);
  ASSERT_TRUE(net->crash(2));
  std::optional<Departure> how;
  self->receive([&](caf::down_msg& d) { how = departureOf(d.reason); }, caf::after(5s) >> [] {});
  ASSERT_TRUE(how.has_value());
  EXPECT_EQ(*how, Departure::kCrashed);
  caf::anon_send_exit(adder, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe::transport
