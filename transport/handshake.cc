#include "transport/handshake.h"

#include <cstring>
#include <vector>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/check.h"

namespace troupe::transport {

Nonce randomNonce() {
  Nonce n{};
  TROUPE_CHECK(RAND_bytes(n.data(), int(n.size())) == 1, "RAND_bytes failed");
  return n;
}

Mac handshakeMac(const std::string& token, const char* label, const Nonce& clientNonce, const Nonce& serverNonce,
                 uint64_t clientId, uint64_t serverId) {
  std::vector<uint8_t> input;
  input.insert(input.end(), label, label + std::strlen(label));
  input.insert(input.end(), clientNonce.begin(), clientNonce.end());
  input.insert(input.end(), serverNonce.begin(), serverNonce.end());
  for (uint64_t id : {clientId, serverId}) {
    for (int i = 0; i < 8; ++i) input.push_back(uint8_t(id >> (8 * i)));
  }
  Mac mac{};
  unsigned int length = 0;
  const uint8_t* ok = HMAC(EVP_sha256(), token.data(), int(token.size()), input.data(), input.size(), mac.data(),
                           &length);
  TROUPE_CHECK(ok != nullptr && length == mac.size(), "HMAC-SHA256 failed");
  return mac;
}

bool macEquals(const Mac& a, const uint8_t* b, size_t bBytes) {
  return bBytes == a.size() && CRYPTO_memcmp(a.data(), b, a.size()) == 0;
}


}  // namespace troupe::transport
