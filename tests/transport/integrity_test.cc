// transport.integrity between two UCX nodes of this process (on loopback):
// frames of every size arrive whole under off, crc32c and hmac; under hmac
// an unsealed or forged frame is refused and counted, a peer with another
// setting is refused in the handshake, naming it, and frames a fault plan
// corrupts are dropped (most by their seal) and resent, the drops counted
// exactly.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/hash.h"
#include "transport/frame.h"
#include "transport/link_faults.h"
#include "transport/local_network.h"
#include "transport/node.h"

namespace troupe::transport {
namespace {

using namespace std::chrono_literals;

class Recorder : public NodeHandler {
 public:
  void onFrame(uint64_t peer, DecodedFrame frame, std::shared_ptr<const void>) override {
    std::lock_guard<std::mutex> lock(mu);
    Got g{peer, frame.envelope.body, {}};
    for (const auto& t : frame.tensors) g.tensors.emplace_back(t.data, t.data + t.bytes);
    frames.push_back(std::move(g));
    cv.notify_all();
  }
  void onPeerDown(uint64_t, Departure, const Status&) override {}
  bool waitForFrames(size_t n, std::chrono::milliseconds timeout = 20s) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return frames.size() >= n; });
  }

  struct Got {
    uint64_t peer;
    std::string body;
    std::vector<std::vector<std::byte>> tensors;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Got> frames;
};

std::vector<std::byte> bytesOf(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng.next() & 0xff);
  return v;
}

// Waits (bounded) until `done` holds; false on timeout.
template <typename Pred>
bool eventually(Pred done, std::chrono::milliseconds timeout = 10s) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

class IntegrityTest : public ::testing::Test {
 protected:
  std::unique_ptr<Node> start(uint64_t id, Recorder* r, Integrity integrity, bool coordinator) {
    NodeOptions o;
    o.nodeId = id;
    o.role = coordinator ? "coordinator" : "node";
    o.token = "a-test-token-that-is-long-enough-0123";
    o.isCoordinator = coordinator;
    if (!coordinator) o.coordinator = coordinatorAddress_;
    o.joinTimeout = 5s;
    o.integrity = integrity;
    o.linkFaults = faults_;
    auto n = Node::start(o, r);
    EXPECT_TRUE(n.hasValue()) << n.status().message();
    if (!n.hasValue()) return nullptr;
    if (coordinator) coordinatorAddress_ = (*n)->address();
    return std::move(*n);
  }

  std::string coordinatorAddress_;
  std::shared_ptr<LinkFaults> faults_;
};

// Tensor sets: none, a small one, 4 KiB, 1 MiB, and three of odd sizes.
std::vector<std::vector<std::vector<std::byte>>> payloads() {
  return {{},
          {bytesOf(13, 1)},
          {bytesOf(4096, 2)},
          {bytesOf(1 << 20, 3)},
          {bytesOf((1 << 20) + 3, 4), bytesOf(7, 5), bytesOf(100 * 1024 + 1, 6)}};
}

// Frame i's body; that of the one with 4 KiB is 20 000 bytes, so its
// envelope goes beside the tensors, not in the active message's header
// (at most 4 KiB).
std::string bodyOf(int round, size_t i) {
  std::string body = "frame " + std::to_string(round) + "." + std::to_string(i);
  if (i == 2) body.append(20000, char('a' + round % 26));
  return body;
}

void sendAll(Node& from, uint64_t to, int rounds) {
  const auto sets = payloads();
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < sets.size(); ++i) {
      Envelope e;
      e.kind = kFirstUserKind;
      e.body = bodyOf(r, i);
      std::vector<Tensor> tensors;
      for (const auto& t : sets[i]) {
        tensors.push_back(Tensor::copyOf(t.data(), t.size()));
      }
      from.send(to, std::move(e), std::move(tensors));
    }
  }
}

void expectAll(Recorder& r, int rounds) {
  const auto sets = payloads();
  const bool all = r.waitForFrames(sets.size() * size_t(rounds));
  std::lock_guard<std::mutex> lock(r.mu);
  ASSERT_TRUE(all) << r.frames.size() << " frames";
  ASSERT_EQ(r.frames.size(), sets.size() * size_t(rounds));
  size_t k = 0;
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < sets.size(); ++i, ++k) {
      const auto& got = r.frames[k];
      EXPECT_EQ(got.body, bodyOf(round, i));
      ASSERT_EQ(got.tensors.size(), sets[i].size()) << got.body;
      for (size_t t = 0; t < sets[i].size(); ++t) EXPECT_TRUE(got.tensors[t] == sets[i][t]) << got.body << " tensor " << t;
    }
  }
}

class IntegrityEachTest : public IntegrityTest, public ::testing::WithParamInterface<Integrity> {};

TEST_P(IntegrityEachTest, FramesOfEverySizeArriveWholeBothWays) {
  Recorder rc, ra;
  auto c = start(1, &rc, GetParam(), true);
  auto a = start(2, &ra, GetParam(), false);
  ASSERT_TRUE(c && a);
  ASSERT_TRUE(a->waitForMembers(2, 10s).isOk());
  sendAll(*a, 1, 4);
  expectAll(rc, 4);
  sendAll(*c, 2, 2);
  expectAll(ra, 2);
  for (Node* n : {c.get(), a.get()}) {
    const NodeStats s = n->stats();
    EXPECT_EQ(s.sealsRefused, 0u);
    EXPECT_EQ(s.malformedDropped, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Guards, IntegrityEachTest,
                         ::testing::Values(Integrity::kOff, Integrity::kCrc32c, Integrity::kHmac),
                         [](const auto& info) { return std::string(integrityName(info.param)); });

TEST_F(IntegrityTest, UnderHmacUnsealedAndForgedFramesAreRefusedAndCounted) {
  Recorder rc, ra;
  auto c = start(1, &rc, Integrity::kHmac, true);
  auto a = start(2, &ra, Integrity::kHmac, false);
  ASSERT_TRUE(c && a);
  ASSERT_TRUE(a->waitForMembers(2, 10s).isOk());
  Envelope e;
  e.kind = kFirstUserKind;
  e.sourceNode = 2;
  e.body = "not from the node";
  auto t = bytesOf(4096, 9);
  const std::vector<TensorView> views = {{t.data(), t.size(), DType::kBytes}};
  // What a peer without the keys can make: a frame with a correct CRC, and
  // one sealed under a key of its own choosing (the next number, too).
  a->sendRawFrame(1, encodeFrame(e, views));
  auto forged = encodeFrame(e, views, Integrity::kHmac);
  // (Numbered far beyond the window: were the window moved before the seal
  // is checked, the node's own frames after it would all be refused.)
  const FrameMac guess(FrameKey{42});
  const auto seal = guess.seal(1000000, forged.data(), forged.size());
  forged.insert(forged.end(), seal.begin(), seal.end());
  a->sendRawFrame(1, forged);
  // ... and one off frame.
  a->sendRawFrame(1, encodeFrame(e, views, Integrity::kOff));
  ASSERT_TRUE(eventually([&] { return c->stats().malformedDropped >= 3; }))
      << c->stats().malformedDropped << " dropped";
  // The connection still carries the node's own frames.
  sendAll(*a, 1, 1);
  expectAll(rc, 1);
  const NodeStats s = c->stats();
  EXPECT_EQ(s.sealsRefused, 1u);     // the forged seal
  EXPECT_EQ(s.unsealedRefused, 2u);  // the CRC'd frame and the off one
  EXPECT_EQ(s.malformedDropped, 3u);
  std::lock_guard<std::mutex> lock(rc.mu);
  for (const auto& g : rc.frames) EXPECT_NE(g.body, "not from the node");
}

TEST_F(IntegrityTest, APeerWithAnotherSettingIsRefusedNamingIt) {
  Recorder rc, ra, rb;
  auto c = start(1, &rc, Integrity::kHmac, true);
  ASSERT_TRUE(c);
  auto a = start(2, &ra, Integrity::kCrc32c, false);  // refused by the coordinator
  ASSERT_TRUE(a);
  // The connecting side finds the mismatch in the challenge (its MAC
  // binds the setting), says so and gives up; the listening side counts a
  // refusal.
  Status st = a->waitForMembers(2, 10s);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("the connecting node runs transport.integrity = crc32c and the listening node hmac"),
            std::string::npos)
      << st.message();
  EXPECT_TRUE(eventually([&] { return c->stats().handshakesRefused == 1; })) << c->stats().handshakesRefused;
  EXPECT_EQ(c->members().size(), 1u);
  // And with the settings the other way round.
  coordinatorAddress_.clear();
  auto c2 = start(3, &rc, Integrity::kOff, true);
  auto b = start(4, &rb, Integrity::kHmac, false);
  ASSERT_TRUE(c2 && b);
  st = b->waitForMembers(2, 10s);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("the connecting node runs transport.integrity = hmac and the listening node off"),
            std::string::npos)
      << st.message();
  EXPECT_TRUE(eventually([&] { return c2->stats().handshakesRefused == 1; })) << c2->stats().handshakesRefused;
  EXPECT_EQ(c2->members().size(), 1u);
}

TEST_F(IntegrityTest, UnderHmacCorruptedFramesAreRefusedByTheirSealAndResent) {
  LinkFaultRule rule;
  rule.kind = LinkFaultKind::kCorrupt;
  rule.probability = 0.25;
  rule.bits = 1;
  faults_ = std::make_shared<LinkFaults>(7, std::vector<LinkFaultRule>{rule});
  Recorder rc, ra;
  auto c = start(1, &rc, Integrity::kHmac, true);
  auto a = start(2, &ra, Integrity::kHmac, false);
  ASSERT_TRUE(c && a);
  ASSERT_TRUE(a->waitForMembers(2, 10s).isOk());
  constexpr int kRounds = 20;  // 100 frames, up to 2 MiB each
  sendAll(*a, 1, kRounds);
  expectAll(rc, kRounds);  // once each, in order, whole
  const NodeStats sa = a->stats(), sc = c->stats();
  EXPECT_GE(sa.faultsCorrupted, 10u);
  // Every corrupted frame, and nothing else, was dropped: most by their
  // seal; any whose envelope's structure broke before that (checked first)
  // as malformed only, any whose integrity word changed as unsealed. The
  // node seals a frame before the fault flips its bits: were they left
  // unsealed, every one would be refused as unsealed and none by its seal.
  EXPECT_TRUE(eventually([&] { return c->stats().malformedDropped == a->stats().faultsCorrupted; }))
      << c->stats().malformedDropped << " dropped, " << a->stats().faultsCorrupted << " corrupted";
  const NodeStats after = c->stats();
  EXPECT_GE(after.sealsRefused * 2, sa.faultsCorrupted);
  EXPECT_LT(after.unsealedRefused * 4, sa.faultsCorrupted);
  EXPECT_LE(after.sealsRefused + after.unsealedRefused, after.malformedDropped);
  EXPECT_EQ(sc.faultsCorrupted, 0u);
  EXPECT_GE(sa.framesResent, sa.faultsCorrupted);
}

TEST(IntegrityLocalNetworkTest, TheInProcessNetworkTakesOnlyCrc32c) {
  Recorder r;
  NodeOptions o;
  o.nodeId = 1;
  o.token = "a-test-token-that-is-long-enough-0123";
  o.isCoordinator = true;
  o.network = LocalNetwork::create();
  o.integrity = Integrity::kHmac;
  auto n = Node::start(o, &r);
  ASSERT_FALSE(n.hasValue());
  EXPECT_EQ(n.status().message(),
            "transport.integrity = hmac: the in-process network carries frames in memory and checks a CRC32C only");
  o.integrity = Integrity::kCrc32c;
  EXPECT_TRUE(Node::start(o, &r).hasValue());
}

}  // namespace
}  // namespace troupe::transport
