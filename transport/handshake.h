// The job-token handshake (DESIGN.md: a peer joins only after it proves it
// holds the job's secret token). Both sides pick a 32-byte random nonce; each
// proves the token by an HMAC-SHA256 over a role label, both nonces and both
// node ids, so a proof cannot be replayed to another connection or reflected
// back. The token itself never crosses the wire.
//
//   connecting side  -> Hello{id_c, nonce_c}
//   listening side   -> Challenge{id_s, nonce_s, mac("server", ...)}
//   connecting side  -> Proof{mac("client", ...)}   (after checking the server)
//
// Threading: plain functions; safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace troupe::transport {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// Cryptographically random bytes (OpenSSL RAND_bytes).
Nonce randomNonce();

// HMAC-SHA256(token, label | clientNonce | serverNonce | clientId | serverId).
Mac handshakeMac(const std::string& token, const char* label, const Nonce& clientNonce,
                 const Nonce& serverNonce, uint64_t clientId, uint64_t serverId);

// Constant-time comparison.
bool macEquals(const Mac& a, const uint8_t* b, size_t bBytes);


}  // namespace troupe::transport
