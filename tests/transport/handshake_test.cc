#include "transport/handshake.h"

#include <gtest/gtest.h>

namespace troupe::transport {
namespace {

TEST(Handshake, MacDependsOnTokenLabelNoncesAndIds) {
  const Nonce a = randomNonce(), b = randomNonce();
  EXPECT_NE(a, b);
  const Mac base = handshakeMac("secret", "client", a, b, 1, 2);
  EXPECT_EQ(base, handshakeMac("secret", "client", a, b, 1, 2));
  EXPECT_NE(base, handshakeMac("Secret", "client", a, b, 1, 2));
  EXPECT_NE(base, handshakeMac("secret", "server", a, b, 1, 2));
  EXPECT_NE(base, handshakeMac("secret", "client", b, a, 1, 2));
  EXPECT_NE(base, handshakeMac("secret", "client", a, b, 2, 1));
  EXPECT_TRUE(macEquals(base, base.data(), base.size()));
  Mac other = base;
  other[31] ^= 1;
  EXPECT_FALSE(macEquals(base, other.data(), other.size()));
  EXPECT_FALSE(macEquals(base, base.data(), base.size() - 1));
  EXPECT_NE(tokenFingerprint("secret"), tokenFingerprint("Secret"));
}

}  // namespace
}  // namespace troupe::transport
