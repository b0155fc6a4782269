#include "transport/handshake.h"

#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "transport/internal/control.h"
#include "transport/internal/handshake_steps.h"

namespace troupe::transport {
namespace {

using internal::ClientHandshake;
using internal::ServerHandshake;

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
}

Nonce nonceOf(uint8_t seed) {
  Nonce n{};
  for (size_t i = 0; i < n.size(); ++i) n[i] = uint8_t(seed * 31 + i * 7 + 1);
  return n;
}

// Every byte string one handshake puts on the wire, in order: hello,
// challenge, proof. Fails the test if the handshake does not succeed.
std::vector<std::string> transcript(const std::string& token, const Nonce& clientNonce, const Nonce& serverNonce) {
  ClientHandshake client(token, 0x11, clientNonce);
  ServerHandshake server(token, 0x22, serverNonce);
  std::vector<std::string> wire{client.hello()};
  auto challenge = server.challenge(wire.back());
  EXPECT_TRUE(challenge.hasValue()) << challenge.status().message();
  if (!challenge.hasValue()) return wire;
  wire.push_back(*challenge);
  auto proof = client.proof(wire.back());
  EXPECT_TRUE(proof.hasValue()) << proof.status().message();
  if (!proof.hasValue()) return wire;
  wire.push_back(*proof);
  EXPECT_TRUE(server.verify(wire.back()).isOk());
  EXPECT_EQ(server.clientId(), 0x11u);
  EXPECT_EQ(client.serverId(), 0x22u);
  return wire;
}

std::set<std::string> windows(const std::string& s, size_t width) {
  std::set<std::string> out;
  for (size_t i = 0; i + width <= s.size(); ++i) out.insert(s.substr(i, width));
  return out;
}

// The 8-byte runs of message i that stay the same when only the nonces
// change (same token) but not when the token changes too: bytes that depend
// on the token and on nothing fresh. Empty when nothing is a function of
// the token alone.
std::vector<std::string> tokenOnlyRuns(const std::vector<std::string>& a, const std::vector<std::string>& sameToken,
                                       const std::vector<std::string>& otherToken) {
  std::vector<std::string> out;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto same = windows(sameToken.at(i), 8), other = windows(otherToken.at(i), 8);
    for (const auto& w : windows(a[i], 8)) {
      if (same.count(w) && !other.count(w)) out.push_back(w);
    }
  }
  return out;
}

TEST(Handshake, NothingOnTheWireIsAFunctionOfTheTokenAlone) {
  const std::string token = "0123456789abcdef0123456789abcdef", other = "fedcba9876543210fedcba9876543210";
  const auto a = transcript(token, nonceOf(1), nonceOf(2));
  const auto b = transcript(token, nonceOf(3), nonceOf(4));       // same token, other nonces
  const auto c = transcript(other, nonceOf(3), nonceOf(4));       // other token, b's nonces
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  ASSERT_EQ(c.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NE(a[i], b[i]) << "message " << i << " is the same under other nonces";
    EXPECT_EQ(a[i].find(token.substr(0, 8)), std::string::npos) << "message " << i << " carries the token";
  }
  EXPECT_TRUE(tokenOnlyRuns(a, b, c).empty());
  // The check itself can fail: a fingerprint (a MAC of the token over fixed
  // inputs, what the hello carried before) appended to each message is found.
  auto tag = [](std::vector<std::string> t, const std::string& key) {
    const Mac m = handshakeMac(key, "fingerprint", Nonce{}, Nonce{}, 0, 0);
    for (auto& s : t) s.append(reinterpret_cast<const char*>(m.data()), 8);
    return t;
  };
  EXPECT_EQ(tokenOnlyRuns(tag(a, token), tag(b, token), tag(c, other)).size(), 3u);
}

TEST(Handshake, AReplayedHandshakeIsRefused) {
  const std::string token = "0123456789abcdef0123456789abcdef";
  const auto captured = transcript(token, randomNonce(), randomNonce());
  ASSERT_EQ(captured.size(), 3u);
  // The captured hello and proof, replayed to the server: its fresh nonce
  // makes the old proof worthless.
  ServerHandshake server(token, 0x22, randomNonce());
  ASSERT_TRUE(server.challenge(captured[0]).hasValue());
  const Status st = server.verify(captured[2]);
  EXPECT_FALSE(st.isOk());
  EXPECT_EQ(st.message(), "wrong job token");
  // The captured challenge, replayed to a client: bound to another nonce.
  ClientHandshake client(token, 0x11, randomNonce());
  auto proof = client.proof(captured[1]);
  ASSERT_FALSE(proof.hasValue());
  EXPECT_EQ(proof.status().message(), "it does not hold the job token");
  // A second hello on one connection is refused, not answered.
  EXPECT_FALSE(server.challenge(captured[0]).hasValue());
}

TEST(Handshake, AReflectedProofIsRefused) {
  const std::string token = "0123456789abcdef0123456789abcdef";
  // A client without the token sends a hello, takes the server's MAC from
  // the challenge and sends it back as its proof.
  ServerHandshake server(token, 0x22, randomNonce());
  ClientHandshake client("not the token, not at all......", 0x11, randomNonce());
  auto challenge = server.challenge(client.hello());
  ASSERT_TRUE(challenge.hasValue());
  auto decoded = internal::decodeChallenge(*challenge);
  ASSERT_TRUE(decoded.hasValue());
  EXPECT_FALSE(server.verify(internal::encodeProof(internal::Proof{decoded->mac})).isOk());
  // Nor does the client accept the server's proof without the token.
  EXPECT_FALSE(client.proof(*challenge).hasValue());
}

TEST(Handshake, EitherSideWithAnotherTokenIsRefused) {
  const std::string a = "token-a-0123456789abcdef01234567", b = "token-b-0123456789abcdef01234567";
  ClientHandshake client(a, 0x11, nonceOf(1));
  ServerHandshake server(b, 0x22, nonceOf(2));
  auto challenge = server.challenge(client.hello());
  ASSERT_TRUE(challenge.hasValue());
  EXPECT_FALSE(client.proof(*challenge).hasValue());  // the client stops here
  // A client that goes on anyway with a proof under its own token, over
  // this connection's nonces and ids: only the token differs. (The same
  // proof under the server's token passes: the check is the token.)
  EXPECT_FALSE(
      server.verify(internal::encodeProof(internal::Proof{handshakeMac(a, "client", nonceOf(1), nonceOf(2), 0x11, 0x22)}))
          .isOk());
  EXPECT_TRUE(
      server.verify(internal::encodeProof(internal::Proof{handshakeMac(b, "client", nonceOf(1), nonceOf(2), 0x11, 0x22)}))
          .isOk());
  // Garbage in place of each message.
  ServerHandshake fresh("t", 0x22, randomNonce());
  EXPECT_FALSE(fresh.verify("garbage").isOk());  // a proof before any hello
  EXPECT_FALSE(fresh.challenge("garbage").hasValue());
  EXPECT_FALSE(ClientHandshake("t", 0x11, randomNonce()).proof("garbage").hasValue());
}

// HMAC-SHA256 by OpenSSL's one-shot call, over label | nonces | ids (little-endian).
Mac opensslMac(const std::string& key, const std::string& label, const Nonce& c, const Nonce& s, uint64_t ci,
               uint64_t si) {
  std::string input = label;
  input.append(reinterpret_cast<const char*>(c.data()), c.size());
  input.append(reinterpret_cast<const char*>(s.data()), s.size());
  for (uint64_t id : {ci, si}) {
    for (int i = 0; i < 8; ++i) input.push_back(char(id >> (8 * i)));
  }
  Mac out{};
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), int(key.size()), reinterpret_cast<const unsigned char*>(input.data()), input.size(),
       out.data(), &length);
  return out;
}

TEST(Handshake, FrameKeysAgreeAcrossAConnectionOnePerDirectionAndAreNewForEach) {
  const std::string token = "frame-key-test-token-0123456789";
  auto run = [&](const Nonce& cn, const Nonce& sn) -> std::optional<std::pair<internal::FrameKeys, internal::FrameKeys>> {
    ClientHandshake c(token, 11, cn, Integrity::kHmac);
    ServerHandshake s(token, 22, sn, Integrity::kHmac);
    auto ch = s.challenge(c.hello());
    if (!ch.hasValue()) return std::nullopt;
    auto pr = c.proof(*ch);
    if (!pr.hasValue() || !s.verify(*pr).isOk()) return std::nullopt;
    return std::make_pair(c.frameKeys(), s.frameKeys());
  };
  const auto one = run(nonceOf(1), nonceOf(2));
  ASSERT_TRUE(one.has_value());
  const auto& [kc, ks] = *one;
  EXPECT_EQ(kc.send, ks.receive);
  EXPECT_EQ(kc.receive, ks.send);
  EXPECT_NE(kc.send, kc.receive);
  EXPECT_EQ(kc.send, opensslMac(token, "frames client to server", nonceOf(1), nonceOf(2), 11, 22));
  EXPECT_EQ(kc.receive, opensslMac(token, "frames server to client", nonceOf(1), nonceOf(2), 11, 22));
  // Another connection (another server nonce) has other keys.
  const auto two = run(nonceOf(1), nonceOf(3));
  ASSERT_TRUE(two.has_value());
  EXPECT_NE(two->first.send, kc.send);
  EXPECT_NE(two->first.receive, kc.receive);
}

TEST(Handshake, AnotherIntegritySettingIsRefusedOnceItsProofChecksOut) {
  const std::string token = "integrity-test-token-0123456789";
  // The connecting side reads the listening side's setting in the
  // challenge, bound into its MAC (label "server/0" is "server").
  ClientHandshake hmacClient(token, 11, nonceOf(1), Integrity::kHmac);
  ServerHandshake crcServer(token, 22, nonceOf(2), Integrity::kCrc32c);
  auto ch = crcServer.challenge(hmacClient.hello());
  ASSERT_TRUE(ch.hasValue());  // nothing about the setting before a proof
  auto pr = hmacClient.proof(*ch);
  ASSERT_FALSE(pr.hasValue());
  EXPECT_EQ(pr.status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(pr.status().message(),
            "the connecting node runs transport.integrity = hmac and the listening node crc32c; every process of a "
            "job must agree");
  // A challenge whose setting was changed on the way fails its MAC instead.
  auto decoded = internal::decodeChallenge(*ch);
  ASSERT_TRUE(decoded.hasValue());
  decoded->integrity = uint8_t(Integrity::kHmac);
  ClientHandshake again(token, 11, nonceOf(1), Integrity::kHmac);
  pr = again.proof(internal::encodeChallenge(*decoded));
  ASSERT_FALSE(pr.hasValue());
  EXPECT_EQ(pr.status().code(), Status::Code::kUnavailable);
  // The listening side refuses a client that goes on with another setting,
  // once its proof (bound to the setting its hello claimed) checks out.
  ServerHandshake server(token, 22, nonceOf(2), Integrity::kCrc32c);
  ch = server.challenge(ClientHandshake(token, 11, nonceOf(1), Integrity::kOff).hello());
  ASSERT_TRUE(ch.hasValue());
  Status st = server.verify(
      internal::encodeProof(internal::Proof{opensslMac(token, "client/1", nonceOf(1), nonceOf(2), 11, 22)}));
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "the connecting node runs transport.integrity = off and the listening node crc32c; every process of a "
            "job must agree");
  // The same proof under the crc32c label is the wrong proof for that hello.
  ServerHandshake server2(token, 22, nonceOf(2), Integrity::kCrc32c);
  ASSERT_TRUE(server2.challenge(ClientHandshake(token, 11, nonceOf(1), Integrity::kOff).hello()).hasValue());
  st = server2.verify(internal::encodeProof(internal::Proof{opensslMac(token, "client", nonceOf(1), nonceOf(2), 11, 22)}));
  EXPECT_EQ(st.code(), Status::Code::kUnavailable);
  // A client of the listening side's setting goes through.
  ClientHandshake crcClient(token, 11, nonceOf(1), Integrity::kCrc32c);
  ServerHandshake s3(token, 22, nonceOf(2), Integrity::kCrc32c);
  ch = s3.challenge(crcClient.hello());
  ASSERT_TRUE(ch.hasValue());
  pr = crcClient.proof(*ch);
  ASSERT_TRUE(pr.hasValue());
  EXPECT_TRUE(s3.verify(*pr).isOk());
}

}  // namespace
}  // namespace troupe::transport
