#include "transport/internal/handshake_steps.h"

#include "common/check.h"
#include "transport/internal/control.h"

namespace troupe::transport::internal {
namespace {

constexpr const char* kClientToServer = "frames client to server";
constexpr const char* kServerToClient = "frames server to client";

// A setting as a hello or challenge carries it.
std::string settingName(uint8_t integrity) {
  return integrity <= uint8_t(Integrity::kHmac) ? integrityName(Integrity(integrity))
                                                : fmt::format("unknown ({})", integrity);
}

// Says both settings from a point of view either side can read.
std::string integrityMismatch(uint8_t client, uint8_t server) {
  return fmt::format("the connecting node runs transport.integrity = {} and the listening node {}; every process "
                     "of a job must agree", settingName(client), settingName(server));
}

// The label of a side's proof: its role, and its transport.integrity when
// that is not crc32c, so that the proof binds the setting it claims.
std::string proofLabel(const char* role, uint8_t integrity) {
  return integrity == uint8_t(Integrity::kCrc32c) ? std::string(role) : fmt::format("{}/{}", role, integrity);
}

}  // namespace

ClientHandshake::ClientHandshake(const std::string& token, uint64_t selfId, const Nonce& nonce, Integrity integrity)
    : token_(token), selfId_(selfId), nonce_(nonce), integrity_(integrity) {}

std::string ClientHandshake::hello() const { return encodeHello(Hello{selfId_, nonce_, uint8_t(integrity_)}); }

Expected<std::string> ClientHandshake::proof(const std::string& challengeBody) {
  auto ch = decodeChallenge(challengeBody);
  if (!ch.hasValue()) return ch.status();
  serverId_ = ch->nodeId;
  const Mac expect =
      handshakeMac(token_, proofLabel("server", ch->integrity).c_str(), nonce_, ch->nonce, selfId_, ch->nodeId);
  if (!macEquals(expect, ch->mac.data(), ch->mac.size())) {
    return Status::unavailable("it does not hold the job token");
  }
  // The server's setting is proven now: a mismatch is a fact, not a forgery.
  if (ch->integrity != uint8_t(integrity_)) {
    return Status::invalidArgument(integrityMismatch(uint8_t(integrity_), ch->integrity));
  }
  serverNonce_ = ch->nonce;
  proven_ = true;
  return encodeProof(Proof{handshakeMac(token_, proofLabel("client", uint8_t(integrity_)).c_str(), nonce_, ch->nonce,
                                        selfId_, ch->nodeId)});
}

FrameKeys ClientHandshake::frameKeys() const {
  TROUPE_CHECK(proven_, "frame keys before the proof");
  return FrameKeys{handshakeMac(token_, kClientToServer, nonce_, serverNonce_, selfId_, serverId_),
                   handshakeMac(token_, kServerToClient, nonce_, serverNonce_, selfId_, serverId_)};
}

ServerHandshake::ServerHandshake(const std::string& token, uint64_t selfId, const Nonce& nonce, Integrity integrity)
    : token_(token), selfId_(selfId), nonce_(nonce), integrity_(integrity) {}

Expected<std::string> ServerHandshake::challenge(const std::string& helloBody) {
  if (challenged_) return Status::corruption("a second hello");
  auto hello = decodeHello(helloBody);
  if (!hello.hasValue()) return hello.status();
  challenged_ = true;
  clientId_ = hello->nodeId;
  clientNonce_ = hello->nonce;
  clientIntegrity_ = hello->integrity;  // checked once the proof shows it is the client's
  return encodeChallenge(Challenge{
      selfId_, nonce_,
      handshakeMac(token_, proofLabel("server", uint8_t(integrity_)).c_str(), clientNonce_, nonce_, clientId_, selfId_),
      uint8_t(integrity_)});
}

Status ServerHandshake::verify(const std::string& proofBody) const {
  if (!challenged_) return Status::unavailable("a proof before any hello");
  auto proof = decodeProof(proofBody);
  if (!proof.hasValue()) return Status::unavailable(proof.status().message());
  const Mac expect =
      handshakeMac(token_, proofLabel("client", clientIntegrity_).c_str(), clientNonce_, nonce_, clientId_, selfId_);
  if (!macEquals(expect, proof->mac.data(), proof->mac.size())) return Status::unavailable("wrong job token");
  if (clientIntegrity_ != uint8_t(integrity_)) {
    return Status::invalidArgument(integrityMismatch(clientIntegrity_, uint8_t(integrity_)));
  }
  return Status::ok();
}

FrameKeys ServerHandshake::frameKeys() const {
  TROUPE_CHECK(challenged_, "frame keys before a challenge");
  return FrameKeys{handshakeMac(token_, kServerToClient, clientNonce_, nonce_, clientId_, selfId_),
                   handshakeMac(token_, kClientToServer, clientNonce_, nonce_, clientId_, selfId_)};
}

}  // namespace troupe::transport::internal
