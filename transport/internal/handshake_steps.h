// The two sides of one token handshake as plain objects (DESIGN.md: a peer
// joins only after it proves it holds the job's token), so that the node and
// the tests run the same code. Each side turns the message it received into
// the one it sends; the node moves the bytes.
//
//   client.hello()                  -> Hello{id_c, nonce_c}
//   server.challenge(hello)         -> Challenge{id_s, nonce_s, mac("server")}
//   client.proof(challenge)         -> Proof{mac("client")}   (server checked)
//   server.verify(proof)            -> ok, or refused
//
// Both MACs are HMAC-SHA256 under the token over the direction's label, both
// nonces and both node ids (handshake.h), so a proof from one connection is
// worth nothing on another (the far side's nonce is fresh), and a server's
// proof reflected back as a client's is refused (the labels differ). Nothing
// that crosses the wire is a function of the token alone.
//
// Threading: one object per connection, used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "transport/handshake.h"

namespace troupe::transport::internal {

class ClientHandshake {
 public:
  ClientHandshake(const std::string& token, uint64_t selfId, const Nonce& nonce);

  std::string hello() const;
  // The Proof body to send after checking the server's MAC. Errors:
  // corruption (a malformed challenge), unavailable (the server does not
  // hold the token).
  Expected<std::string> proof(const std::string& challengeBody);
  // The server's node id, known after a challenge decoded.
  uint64_t serverId() const { return serverId_; }

 private:
  std::string token_;
  uint64_t selfId_, serverId_ = 0;
  Nonce nonce_;
};

class ServerHandshake {
 public:
  ServerHandshake(const std::string& token, uint64_t selfId, const Nonce& nonce);

  // The Challenge body for a Hello; corruption when the hello is malformed.
  // May be called once.
  Expected<std::string> challenge(const std::string& helloBody);
  // Ok when the proof shows the client holds the token for this
  // connection's nonces; unavailable otherwise (or before a challenge).
  Status verify(const std::string& proofBody) const;
  // The client's claimed node id (after a hello; proven once verify is ok).
  uint64_t clientId() const { return clientId_; }

 private:
  std::string token_;
  uint64_t selfId_, clientId_ = 0;
  Nonce nonce_, clientNonce_{};
  bool challenged_ = false;
};

}  // namespace troupe::transport::internal
