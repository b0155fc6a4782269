// libFuzzer target for everything a peer's bytes reach after the frame
// decoder: the actor-message decoder (transport/message_codec.h) and the
// control-message decoders (transport/internal/control.h), including Hello
// and Proof, which anyone who can open a socket may send. Built with
// AddressSanitizer; what decodes as an actor message must re-encode and
// decode to the same number of elements.
//
//   cmake --build build-fuzz --target message_fuzz
//   build-fuzz/tests/fuzz/message_fuzz -max_total_time=300 corpus-message/
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include <caf/all.hpp>

#include "transport/frame.h"
#include "transport/internal/control.h"
#include "transport/message_codec.h"

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
  auto frame = decodeFrame(reinterpret_cast<const std::byte*>(owner->data()), owner->size());
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
