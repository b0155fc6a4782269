// libFuzzer target for the frame decoder (transport/frame.h). Any input must
// decode to a value or an error without a crash or an out-of-bounds read (the
// target is built with AddressSanitizer); what decodes must survive a
// re-encode and decode unchanged, under the integrity its header names
// (an hmac frame's seal is not checked on the way in, and is made anew
// under a fixed key on the way out).
//
//   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
//         -DTROUPE_FUZZ=ON -DTROUPE_BUILD_TESTS=OFF -DTROUPE_BUILD_BENCH=OFF -DTROUPE_CUDA=OFF
//   cmake --build build-fuzz --target frame_fuzz
//   build-fuzz/tests/fuzz/frame_fuzz -max_total_time=300 corpus/
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "transport/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::transport;
  const auto word = frameIntegrityWord(reinterpret_cast<const std::byte*>(data), size);
  const Integrity integrity = word && *word <= uint32_t(Integrity::kHmac) ? Integrity(*word) : Integrity::kCrc32c;
  auto decoded = decodeFrame(reinterpret_cast<const std::byte*>(data), size, FrameCheck{integrity, nullptr, false});
  if (!decoded.hasValue()) return 0;
  static const FrameMac mac(FrameKey{7, 1, 2, 3});
  auto again = encodeFrame(decoded->envelope, decoded->tensors, integrity);
  if (integrity == Integrity::kHmac) {
    const auto seal = mac.seal(decoded->sealSeq, again.data(), again.size());
    again.insert(again.end(), seal.begin(), seal.end());
  }
  auto round = decodeFrame(again.data(), again.size(), FrameCheck{integrity, &mac, true});
  if (!round.hasValue() || round->sealSeq != decoded->sealSeq) std::abort();
  const Envelope &a = decoded->envelope, &b = round->envelope;
  if (a.sourceNode != b.sourceNode || a.sourceActor != b.sourceActor || a.destActor != b.destActor ||
      a.requestId != b.requestId || a.kind != b.kind || a.body != b.body ||
      decoded->tensors.size() != round->tensors.size()) {
    std::abort();
  }
  for (size_t i = 0; i < decoded->tensors.size(); ++i) {
    const auto &x = decoded->tensors[i], &y = round->tensors[i];
    if (x.bytes != y.bytes || x.dtype != y.dtype || (x.bytes && std::memcmp(x.data, y.data, x.bytes) != 0)) {
      std::abort();
    }
  }
  return 0;
}
