// transport/internal/capnp_util.h: the flat form written in place is
// byte for byte Cap'n Proto's own (messageToFlatArray), for one segment and
// for several (odd and even counts, which pad the segment table
// differently); a second builder alive on a thread falls back to the heap
// and still writes the same bytes; the scratch is clean for the next
// message; WordsOf reads aligned words in place and copies unaligned ones.
// And through the codecs: bodies and envelopes larger than the scratch
// round-trip, and a frame at an odd address decodes.
#include "transport/internal/capnp_util.h"

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <capnp/any.h>
#include <capnp/serialize.h>
#include <caf/message.hpp>
#include <gtest/gtest.h>

#include "transport/frame.h"
#include "transport/message_codec.h"

namespace troupe::transport::internal {
namespace {

// `texts` texts of `bytes` bytes each, as the root of `message`.
void fill(capnp::MessageBuilder& message, int texts, size_t bytes) {
  auto list = message.initRoot<capnp::AnyPointer>().initAs<capnp::List<capnp::Text>>(unsigned(texts));
  for (int i = 0; i < texts; ++i) {
    std::string t(bytes, char('a' + i));
    list.set(unsigned(i), capnp::Text::Reader(t.data(), t.size()));
  }
}

std::vector<std::byte> flatOf(capnp::MessageBuilder& message) {
  std::vector<std::byte> out(flatBytes(message), std::byte{0x5a});
  writeFlat(message, out.data());
  return out;
}

std::vector<std::byte> capnpFlatOf(capnp::MessageBuilder& message) {
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::vector<std::byte>(reinterpret_cast<const std::byte*>(bytes.begin()),
                                reinterpret_cast<const std::byte*>(bytes.end()));
}

TEST(CapnpUtil, WritesCapnProtosFlatFormForOneSegmentAndForSeveral) {
  std::set<size_t> segmentCounts;
  for (int texts = 1; texts <= 6; ++texts) {
    for (size_t bytes : {size_t{10}, size_t{3000}, size_t{20000}}) {
      ScratchBuilder scratch;
      fill(scratch.get(), texts, bytes);
      segmentCounts.insert(scratch.get().getSegmentsForOutput().size());
      EXPECT_EQ(flatOf(scratch.get()), capnpFlatOf(scratch.get())) << texts << " x " << bytes;
    }
  }
  // One segment, and both an odd and an even number of several.
  EXPECT_TRUE(segmentCounts.count(1));
  bool odd = false, even = false;
  for (size_t n : segmentCounts) {
    if (n > 1) (n % 2 ? odd : even) = true;
  }
  EXPECT_TRUE(odd && even) << "segment counts seen: " << segmentCounts.size();
}

TEST(CapnpUtil, ASecondBuilderOnTheThreadWritesTheSameBytes) {
  ScratchBuilder first;
  ScratchBuilder second;  // the scratch is taken: the heap
  fill(first.get(), 3, 100);
  fill(second.get(), 3, 100);
  EXPECT_EQ(flatOf(first.get()), flatOf(second.get()));
  EXPECT_EQ(flatOf(second.get()), capnpFlatOf(second.get()));
}

TEST(CapnpUtil, TheScratchIsCleanForTheNextMessage) {
  std::vector<std::byte> small;
  {
    ScratchBuilder fresh;
    fill(fresh.get(), 1, 8);
    small = flatOf(fresh.get());
  }
  {
    ScratchBuilder big;  // writes most of the scratch
    fill(big.get(), 2, 3000);
  }
  ScratchBuilder again;
  fill(again.get(), 1, 8);
  EXPECT_EQ(flatOf(again.get()), small);
}

TEST(CapnpUtil, WordsOfReadsAlignedWordsInPlaceAndCopiesOthers) {
  std::vector<uint64_t> storage(9);
  for (size_t i = 0; i < storage.size(); ++i) storage[i] = 0x0101010101010101ull * i;
  WordsOf aligned(storage.data(), 64);
  EXPECT_EQ(static_cast<const void*>(aligned.get().begin()), static_cast<const void*>(storage.data()));
  EXPECT_EQ(aligned.get().size(), 8u);
  const auto* odd = reinterpret_cast<const std::byte*>(storage.data()) + 4;
  WordsOf copied(odd, 64);
  EXPECT_NE(static_cast<const void*>(copied.get().begin()), static_cast<const void*>(odd));
  EXPECT_EQ(std::memcmp(copied.get().begin(), odd, 64), 0);
}

TEST(CapnpUtil, BodiesAndEnvelopesLargerThanTheScratchRoundTrip) {
  const std::string text(100000, 'q');  // many segments' worth
  std::string body;
  std::vector<Tensor> tensors;
  ASSERT_TRUE(encodeMessage(caf::make_message(text, int64_t{7}), &body, &tensors).isOk());
  auto back = decodeMessage(body, {}, nullptr);
  ASSERT_TRUE(back.hasValue()) << back.status().message();
  ASSERT_TRUE((back->match_elements<std::string, int64_t>()));
  EXPECT_EQ(back->get_as<std::string>(0), text);
  EXPECT_EQ(back->get_as<int64_t>(1), 7);

  Envelope e;
  e.kind = 99;
  e.requestId = 12345;
  e.body = body;
  const auto frame = encodeFrame(e, {});
  // At an address 4 bytes off a word: decoded from a copy.
  std::vector<std::byte> shifted(frame.size() + 8);
  std::byte* at = shifted.data() + (8 - reinterpret_cast<uintptr_t>(shifted.data()) % 8) % 8 + 4;
  std::memcpy(at, frame.data(), frame.size());
  for (const std::byte* data : {frame.data(), static_cast<const std::byte*>(at)}) {
    auto decoded = decodeFrame(data, frame.size());
    ASSERT_TRUE(decoded.hasValue()) << decoded.status().message();
    EXPECT_EQ(decoded->envelope.kind, 99);
    EXPECT_EQ(decoded->envelope.requestId, 12345u);
    EXPECT_EQ(decoded->envelope.body, body);
  }
}

}  // namespace
}  // namespace troupe::transport::internal
