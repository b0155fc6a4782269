#include "transport/internal/control.h"

#include <gtest/gtest.h>

#include "common/hash.h"

namespace troupe::transport::internal {
namespace {

TEST(Control, MessagesRoundTrip) {
  Hello h{7, randomNonce()};
  auto h2 = decodeHello(encodeHello(h));
  ASSERT_TRUE(h2.hasValue()) << h2.status().message();
  EXPECT_EQ(h2->nodeId, 7u);
  EXPECT_EQ(h2->nonce, h.nonce);
  Challenge c{8, randomNonce(), handshakeMac("t", "server", h.nonce, h.nonce, 1, 2)};
  auto c2 = decodeChallenge(encodeChallenge(c));
  ASSERT_TRUE(c2.hasValue());
  EXPECT_EQ(c2->mac, c.mac);
  MemberList list{{Member{1, "coordinator", "127.0.0.1", 4000}, Member{2, "ps", "10.0.0.2", 4001}}, 3};
  auto l2 = decodeMembers(encodeMembers(list));
  ASSERT_TRUE(l2.hasValue()) << l2.status().message();
  ASSERT_EQ(l2->members.size(), 2u);
  EXPECT_EQ(l2->members[1].host, "10.0.0.2");
  EXPECT_EQ(l2->epoch, 3u);
  auto j = decodeJoin(encodeJoin(Member{5, "worker", "127.0.0.1", 1234}));
  ASSERT_TRUE(j.hasValue());
  EXPECT_EQ(j->role, "worker");
}

TEST(Control, BadFieldsAreRefused) {
  EXPECT_FALSE(decodeHello(encodeHello(Hello{0, randomNonce()})).hasValue());  // no node id
  EXPECT_FALSE(decodeJoin(encodeJoin(Member{5, "w", "0.0.0.0", 1})).hasValue());  // not reachable
  EXPECT_FALSE(decodeJoin(encodeJoin(Member{5, "w", "not-an-ip", 1})).hasValue());
  EXPECT_FALSE(decodeJoin(encodeJoin(Member{5, "w", "127.0.0.1", 0})).hasValue());
  // A proof with a short MAC: take a challenge body (its mac field is not at
  // the proof's offset) and a random body.
  EXPECT_FALSE(decodeProof(encodeEmpty()).hasValue());
}

TEST(Control, GarbageIsAnErrorNotACrash) {
  Rng rng(5);
  for (int i = 0; i < 5000; ++i) {
    std::string body(8 * (rng.next() % 24), '\0');
    for (auto& ch : body) ch = char(rng.next());
    (void)decodeHello(body);
    (void)decodeChallenge(body);
    (void)decodeProof(body);
    (void)decodeRefused(body);
    (void)decodeJoin(body);
    (void)decodeMembers(body);
  }
  EXPECT_FALSE(decodeHello("").hasValue());
  EXPECT_FALSE(decodeHello("1234567").hasValue());
}

}  // namespace
}  // namespace troupe::transport::internal
