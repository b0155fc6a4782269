// libFuzzer target for the token handshake's two sides
// (transport/internal/handshake_steps.h), which read what anyone who can open
// a socket sends: a hello, a challenge, a proof. Any input must give a value
// or an error, never a crash; a proof that is not the right MAC must never
// pass.
//
// The first byte picks the message; the rest is its body:
//   0  a hello to a fresh server;
//   1  a challenge to a client that sent its hello;
//   2  a proof to a server that challenged a valid hello.
// TROUPE_FUZZ_SEEDS=DIR writes a valid message of each kind there first.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "transport/handshake.h"
#include "transport/internal/control.h"
#include "transport/internal/handshake_steps.h"

namespace {

using namespace troupe::transport;
using internal::ClientHandshake;
using internal::ServerHandshake;

const std::string kToken = "0123456789abcdef0123456789abcdef";

Nonce fixedNonce(uint8_t seed) {
  Nonce n{};
  for (size_t i = 0; i < n.size(); ++i) n[i] = uint8_t(seed + i);
  return n;
}

using troupe::fuzz::writeSeed;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("TROUPE_FUZZ_SEEDS");
  if (!dir) return 0;
  ClientHandshake client(kToken, 0x11, fixedNonce(1));
  ServerHandshake server(kToken, 0x22, fixedNonce(2));
  const std::string hello = client.hello();
  auto challenge = server.challenge(hello);
  auto proof = client.proof(*challenge);
  writeSeed(dir, 0, 0, hello);
  writeSeed(dir, 1, 1, *challenge);
  writeSeed(dir, 2, 2, *proof);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0: {
      ServerHandshake server(kToken, 0x22, fixedNonce(2));
      auto challenge = server.challenge(body);
      if (challenge.hasValue() && server.verify(body).isOk()) std::abort();  // a hello is no proof
      return 0;
    }
    case 1: {
      ClientHandshake client(kToken, 0x11, fixedNonce(1));
      auto proof = client.proof(body);
      // A proof only for a challenge whose MAC is the server's under the token.
      auto ch = internal::decodeChallenge(body);
      if (proof.hasValue() &&
          !(ch.hasValue() && ch->mac == handshakeMac(kToken, "server", fixedNonce(1), ch->nonce, 0x11, ch->nodeId))) {
        std::abort();
      }
      return 0;
    }
    default: {
      ServerHandshake server(kToken, 0x22, fixedNonce(2));
      ClientHandshake client(kToken, 0x11, fixedNonce(1));
      if (!server.challenge(client.hello()).hasValue()) std::abort();
      const bool passed = server.verify(body).isOk();
      // Only the client's own proof passes.
      auto decoded = internal::decodeProof(body);
      const Mac right = handshakeMac(kToken, "client", fixedNonce(1), fixedNonce(2), 0x11, 0x22);
      if (passed && !(decoded.hasValue() && decoded->mac == right)) std::abort();
      return 0;
    }
  }
}
