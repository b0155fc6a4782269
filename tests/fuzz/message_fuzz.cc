// libFuzzer target for everything a peer's bytes reach after the frame
// decoder: the actor-message decoder (transport/message_codec.h) and the
// control-message decoders (transport/internal/control.h), including Hello
// and Proof, which anyone who can open a socket may send. Built with
// AddressSanitizer; what decodes as an actor message must re-encode and
// decode to the same number of elements.
//
//   cmake --build build-fuzz --target message_fuzz
//   TROUPE_FUZZ_SEEDS=corpus-message build-fuzz/tests/fuzz/message_fuzz -max_total_time=300 corpus-message/
//
// With TROUPE_FUZZ_SEEDS=DIR it first writes valid inputs of every kind
// there (actor messages with every value kind and tensors, each control
// message), so the fuzzer starts past the outer checks.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "tests/fuzz/fuzz_util.h"
#include "transport/frame.h"
#include "transport/handshake.h"
#include "transport/internal/control.h"
#include "transport/message_codec.h"

namespace {

using troupe::fuzz::writeSeed;

void writeSeeds(const std::string& dir) {
  using namespace troupe::transport;
  namespace in = troupe::transport::internal;
  int n = 0;
  writeSeed(dir, n++, 0, in::encodeHello(in::Hello{7, randomNonce()}));
  writeSeed(dir, n++, 1, in::encodeChallenge(in::Challenge{7, randomNonce(), {}}));
  writeSeed(dir, n++, 2, in::encodeProof(in::Proof{}));
  writeSeed(dir, n++, 3, in::encodeRefused(in::Refused{"wrong job token"}));
  writeSeed(dir, n++, 4, in::encodeJoin(Member{5, "worker", "127.0.0.1", 4000}));
  writeSeed(dir, n++, 5, in::encodeMembers(in::MemberList{{Member{1, "c", "10.0.0.1", 1}, Member{2, "w", "10.0.0.2", 2}}, 1}));
  using a_atom = caf::atom_constant<caf::atom("pull")>;
  std::vector<float> f = {1, 2, 3};
  const std::vector<caf::message> messages = {
      caf::make_message(a_atom::value, int64_t(-1), uint64_t(2), int32_t(3), uint32_t(4), uint16_t(5)),
      caf::make_message(2.5, 0.5f, true, std::string("text"), caf::unit),
      caf::make_message(caf::make_error(caf::sec::request_timeout, "ctx")),
      caf::make_message(a_atom::value, Tensor::copyOf(f.data(), 12, DType::kFloat32), Tensor::copyOf("ab", 2)),
  };
  for (const auto& m : messages) {
    Envelope e;
    e.kind = 16;
    std::vector<Tensor> tensors;
    if (!encodeMessage(m, &e.body, &tensors).isOk()) std::abort();
    std::vector<TensorView> views;
    for (const auto& t : tensors) views.push_back(TensorView{t.data, t.bytes, t.dtype});
    auto frame = encodeFrame(e, views);
    writeSeed(dir, n++, 7, std::string(reinterpret_cast<const char*>(frame.data()), frame.size()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("TROUPE_FUZZ_SEEDS")) writeSeeds(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::transport;
  if (size < 1) return 0;
  // The first byte picks the decoder; the rest is its input.
  const uint8_t which = data[0] % 8;
  std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (which) {
    case 0: (void)internal::decodeHello(body); return 0;
    case 1: (void)internal::decodeChallenge(body); return 0;
    case 2: (void)internal::decodeProof(body); return 0;
    case 3: (void)internal::decodeRefused(body); return 0;
    case 4: (void)internal::decodeJoin(body); return 0;
    case 5: (void)internal::decodeMembers(body); return 0;
    default: break;
  }
  // A whole frame, then the actor message in it.
  auto owner = std::make_shared<std::string>(std::move(body));
  auto frame = decodeFrame(reinterpret_cast<const std::byte*>(owner->data()), owner->size(), FrameCheck{Integrity::kCrc32c, nullptr, false});
  if (!frame.hasValue()) return 0;
  auto msg = decodeMessage(frame->envelope.body, frame->tensors, owner);
  if (!msg.hasValue()) return 0;
  std::string again;
  std::vector<Tensor> tensors;
  if (!encodeMessage(*msg, &again, &tensors).isOk()) std::abort();
  std::vector<TensorView> views;
  for (const auto& t : tensors) views.push_back(TensorView{t.data, t.bytes, t.dtype});
  auto round = decodeMessage(again, views, owner);
  if (!round.hasValue() || round->size() != msg->size()) std::abort();
  return 0;
}
