#include "transport/message_codec.h"

#include <cstring>

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include "common/hash.h"

namespace troupe::transport {
namespace {

using ping_atom = caf::atom_constant<caf::atom("ping")>;

// Encodes, lays the tensors out as a received frame would, decodes.
Expected<caf::message> roundTrip(const caf::message& msg) {
  Envelope e;
  std::vector<Tensor> tensors;
  Status st = encodeMessage(msg, &e.body, &tensors);
  if (!st.isOk()) return st;
  std::vector<TensorView> views;
  for (const auto& t : tensors) views.push_back(TensorView{t.data, t.bytes, t.dtype});
  auto frame = std::make_shared<std::vector<std::byte>>(encodeFrame(e, views));
  auto decoded = decodeFrame(frame->data(), frame->size());
  if (!decoded.hasValue()) return decoded.status();
  return decodeMessage(decoded->envelope.body, decoded->tensors, frame);
}

TEST(MessageCodec, EveryValueKindRoundTrips) {
  std::vector<float> floats = {1.5f, -2.25f, 3.0f};
  auto msg = caf::make_message(ping_atom::value, int64_t(-5), uint64_t(1) << 63, int32_t(-7), uint32_t(9),
                               uint16_t(65535), 2.5, 0.25f, true, std::string("hello"),
                               Tensor::copyOf(floats.data(), floats.size() * 4, DType::kFloat32),
                               caf::make_error(caf::sec::request_timeout), caf::unit);
  auto back = roundTrip(msg);
  ASSERT_TRUE(back.hasValue()) << back.status().message();
  ASSERT_EQ(back->size(), msg.size());
  EXPECT_EQ(back->get_as<caf::atom_value>(0), ping_atom::value);
  EXPECT_EQ(back->get_as<int64_t>(1), -5);
  EXPECT_EQ(back->get_as<uint64_t>(2), uint64_t(1) << 63);
  EXPECT_EQ(back->get_as<int32_t>(3), -7);
  EXPECT_EQ(back->get_as<uint32_t>(4), 9u);
  EXPECT_EQ(back->get_as<uint16_t>(5), 65535);
  EXPECT_EQ(back->get_as<double>(6), 2.5);
  EXPECT_EQ(back->get_as<float>(7), 0.25f);
  EXPECT_TRUE(back->get_as<bool>(8));
  EXPECT_EQ(back->get_as<std::string>(9), "hello");
  const Tensor& t = back->get_as<Tensor>(10);
  ASSERT_EQ(t.bytes, 12u);
  EXPECT_EQ(t.dtype, DType::kFloat32);
  EXPECT_EQ(std::memcmp(t.data, floats.data(), 12), 0);
  EXPECT_EQ(back->get_as<caf::error>(11), caf::sec::request_timeout);
  EXPECT_TRUE(back->match_element<caf::unit_t>(12));
}

// Found by message_fuzz: an error with code 0 is CAF's "no error", which has
// no code to read; it must survive a round trip and a re-encode.
TEST(MessageCodec, NoErrorRoundTrips) {
  auto back = roundTrip(caf::make_message(caf::error{}));
  ASSERT_TRUE(back.hasValue()) << back.status().message();
  EXPECT_FALSE(back->get_as<caf::error>(0));
  auto again = roundTrip(*back);
  ASSERT_TRUE(again.hasValue());
}

TEST(MessageCodec, RefusesTypesThatCannotCrossProcesses) {
  std::vector<Tensor> tensors;
  std::string body;
  Status st = encodeMessage(caf::make_message(std::vector<int>{1}), &body, &tensors);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
}

TEST(MessageCodec, GarbageBodiesAreErrorsNotCrashes) {
  Rng rng(3);
  auto owner = std::make_shared<int>(0);
  for (int i = 0; i < 3000; ++i) {
    std::string body(8 * (rng.next() % 40), '\0');
    for (auto& c : body) c = char(rng.next());
    std::vector<std::byte> tensorBytes(16);
    std::vector<TensorView> views = {TensorView{tensorBytes.data(), 16, DType::kBytes}};
    auto r = decodeMessage(body, rng.next() % 2 ? views : std::vector<TensorView>{}, owner);
    (void)r;  // either value or error; must not crash or read out of bounds
  }
  // A tensor index past the frame's tensors is refused.
  std::string body;
  std::vector<Tensor> tensors;
  ASSERT_TRUE(encodeMessage(caf::make_message(Tensor::copyOf("abcd", 4)), &body, &tensors).isOk());
  EXPECT_FALSE(decodeMessage(body, {}, owner).hasValue());
  // A frame tensor that no element names is refused.
  std::string plain;
  ASSERT_TRUE(encodeMessage(caf::make_message(int64_t(1)), &plain, &tensors).isOk());
  std::vector<std::byte> extra(8);
  EXPECT_FALSE(decodeMessage(plain, {TensorView{extra.data(), 8, DType::kBytes}}, owner).hasValue());
}

}  // namespace
}  // namespace troupe::transport
