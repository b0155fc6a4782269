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
// Both sides say their transport.integrity (frame.h), bound into their
// proof (the label "client" or "server" gains "/N" for a setting other
// than crc32c), and refuse a peer whose differs once its proof checked out:
// the client on the challenge, the server (for a client that went on
// anyway) on the proof. Nothing tells a stranger this node's setting but
// the challenge every connecting peer gets.
//
// Each side's frame keys (for integrity = hmac) are HMAC-SHA256 under the
// token over a direction's label ("frames client to server", "frames
// server to client"), both nonces and both node ids: fresh for every
// connection, one per direction, never on the wire. The client knows them
// once its proof is made; the server once it made its challenge, and it
// trusts frames under them once the proof verified.
//
// Threading: one object per connection, used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "transport/frame.h"
#include "transport/handshake.h"

namespace troupe::transport::internal {

// This side's keys for the frames of one connection.
struct FrameKeys {
  FrameKey send{}, receive{};
};

class ClientHandshake {
 public:
  ClientHandshake(const std::string& token, uint64_t selfId, const Nonce& nonce,
                  Integrity integrity = Integrity::kCrc32c);

  std::string hello() const;
  // The Proof body to send after checking the server's MAC. Errors:
  // corruption (a malformed challenge), unavailable (the server does not
  // hold the token), invalidArgument (it holds it, with another
  // transport.integrity).
  Expected<std::string> proof(const std::string& challengeBody);
  // The server's node id, known after a challenge decoded.
  uint64_t serverId() const { return serverId_; }
  // This connection's frame keys; only after proof() succeeded.
  FrameKeys frameKeys() const;

 private:
  std::string token_;
  uint64_t selfId_, serverId_ = 0;
  Nonce nonce_, serverNonce_{};
  Integrity integrity_;
  bool proven_ = false;
};

class ServerHandshake {
 public:
  ServerHandshake(const std::string& token, uint64_t selfId, const Nonce& nonce,
                  Integrity integrity = Integrity::kCrc32c);

  // The Challenge body for a Hello; corruption when the hello is malformed.
  // May be called once.
  Expected<std::string> challenge(const std::string& helloBody);
  // Ok when the proof shows the client holds the token for this
  // connection's nonces; unavailable otherwise (or before a challenge);
  // invalidArgument when it does, with another transport.integrity.
  Status verify(const std::string& proofBody) const;
  // The client's claimed node id and transport.integrity (after a hello;
  // proven once verify is ok).
  uint64_t clientId() const { return clientId_; }
  uint8_t clientIntegrity() const { return clientIntegrity_; }
  // This connection's frame keys, known once a challenge was made. Trust
  // frames under the receive key only once verify() was ok; the send key
  // also seals a refusal of a proof, so that only a holder of the token
  // can end the client's join that way.
  FrameKeys frameKeys() const;

 private:
  std::string token_;
  uint64_t selfId_, clientId_ = 0;
  Nonce nonce_, clientNonce_{};
  Integrity integrity_;
  uint8_t clientIntegrity_ = 0;  // as its hello says
  bool challenged_ = false;
};

}  // namespace troupe::transport::internal
