#include "transport/internal/handshake_steps.h"

#include "transport/internal/control.h"

namespace troupe::transport::internal {

ClientHandshake::ClientHandshake(const std::string& token, uint64_t selfId, const Nonce& nonce)
    : token_(token), selfId_(selfId), nonce_(nonce) {}

std::string ClientHandshake::hello() const { return encodeHello(Hello{selfId_, nonce_}); }

Expected<std::string> ClientHandshake::proof(const std::string& challengeBody) {
  auto ch = decodeChallenge(challengeBody);
  if (!ch.hasValue()) return ch.status();
  serverId_ = ch->nodeId;
  const Mac expect = handshakeMac(token_, "server", nonce_, ch->nonce, selfId_, ch->nodeId);
  if (!macEquals(expect, ch->mac.data(), ch->mac.size())) {
    return Status::unavailable("it does not hold the job token");
  }
  return encodeProof(Proof{handshakeMac(token_, "client", nonce_, ch->nonce, selfId_, ch->nodeId)});
}

ServerHandshake::ServerHandshake(const std::string& token, uint64_t selfId, const Nonce& nonce)
    : token_(token), selfId_(selfId), nonce_(nonce) {}

Expected<std::string> ServerHandshake::challenge(const std::string& helloBody) {
  if (challenged_) return Status::corruption("a second hello");
  auto hello = decodeHello(helloBody);
  if (!hello.hasValue()) return hello.status();
  challenged_ = true;
  clientId_ = hello->nodeId;
  clientNonce_ = hello->nonce;
  return encodeChallenge(
      Challenge{selfId_, nonce_, handshakeMac(token_, "server", clientNonce_, nonce_, clientId_, selfId_)});
}

Status ServerHandshake::verify(const std::string& proofBody) const {
  if (!challenged_) return Status::unavailable("a proof before any hello");
  auto proof = decodeProof(proofBody);
  if (!proof.hasValue()) return Status::unavailable(proof.status().message());
  const Mac expect = handshakeMac(token_, "client", clientNonce_, nonce_, clientId_, selfId_);
  if (!macEquals(expect, proof->mac.data(), proof->mac.size())) return Status::unavailable("wrong job token");
  return Status::ok();
}

}  // namespace troupe::transport::internal
