#include "transport/message_codec.h"

#include <cstring>

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include "common/hash.h"

namespace troupe::transport {
namespace {

using ping_atom = caf::atom_constant<caf::atom("ping")>;

// A record with a field of every kind a record may hold.
struct Everything {
  bool flag = false;
  int32_t small = 0;
  int64_t big = 0;
  uint64_t node = 0;
  double rate = 0;
  std::string name;
  Tensor data;
  std::vector<int64_t> ranks;
  std::vector<uint64_t> nodes;
  std::vector<double> times;
  std::vector<std::string> roles;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Everything& x) {
  return f(caf::meta::type_name("Everything"), x.flag, x.small, x.big, x.node, x.rate, x.name, x.data, x.ranks,
           x.nodes, x.times, x.roles);
}

// Two records of the same shape under other names, and one with a field
// fewer: what a peer of another version (or a liar) would send.
struct Pair {
  int64_t a = 0;
  std::string b;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Pair& x) {
  return f(x.a, x.b);
}
struct Swapped {
  std::string b;
  int64_t a = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Swapped& x) {
  return f(x.b, x.a);
}
struct Short {
  int64_t a = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Short& x) {
  return f(x.a);
}
struct Long {
  int64_t a = 0;
  std::string b;
  bool c = false;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Long& x) {
  return f(x.a, x.b, x.c);
}

// Encodes with `out`, lays the tensors out as a received frame would,
// decodes with `in`.
Expected<caf::message> roundTrip(const caf::message& msg, const WireTypes* out = nullptr,
                                 const WireTypes* in = nullptr) {
  Envelope e;
  std::vector<Tensor> tensors;
  Status st = encodeMessage(msg, &e.body, &tensors, out);
  if (!st.isOk()) return st;
  std::vector<TensorView> views;
  for (const auto& t : tensors) views.push_back(TensorView{t.data, t.bytes, t.dtype});
  auto frame = std::make_shared<std::vector<std::byte>>(encodeFrame(e, views));
  auto decoded = decodeFrame(frame->data(), frame->size());
  if (!decoded.hasValue()) return decoded.status();
  return decodeMessage(decoded->envelope.body, decoded->tensors, frame, in);
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

TEST(MessageCodec, RecordsRoundTripWithEveryFieldKind) {
  WireTypes types;
  types.add<Everything>("test.Everything");
  std::vector<float> floats = {1.0f, 2.0f};
  Everything x;
  x.flag = true;
  x.small = -3;
  x.big = int64_t(1) << 40;
  x.node = ~uint64_t{0};
  x.rate = 0.125;
  x.name = "worker";
  x.data = Tensor::copyOf(floats.data(), 8, DType::kFloat32);
  x.ranks = {0, -1, 7};
  x.nodes = {uint64_t(1) << 63};
  x.times = {1.5, -2.5};
  x.roles = {"ps", "", "worker"};
  auto back = roundTrip(caf::make_message(ping_atom::value, x, int64_t(9)), &types, &types);
  ASSERT_TRUE(back.hasValue()) << back.status().message();
  ASSERT_TRUE((back->match_elements<caf::atom_value, Everything, int64_t>()));
  const auto& y = back->get_as<Everything>(1);
  EXPECT_EQ(y.flag, true);
  EXPECT_EQ(y.small, -3);
  EXPECT_EQ(y.big, int64_t(1) << 40);
  EXPECT_EQ(y.node, ~uint64_t{0});
  EXPECT_EQ(y.rate, 0.125);
  EXPECT_EQ(y.name, "worker");
  ASSERT_EQ(y.data.bytes, 8u);
  EXPECT_EQ(y.data.dtype, DType::kFloat32);
  EXPECT_EQ(std::memcmp(y.data.data, floats.data(), 8), 0);
  EXPECT_EQ(y.ranks, (std::vector<int64_t>{0, -1, 7}));
  EXPECT_EQ(y.nodes, (std::vector<uint64_t>{uint64_t(1) << 63}));
  EXPECT_EQ(y.times, (std::vector<double>{1.5, -2.5}));
  EXPECT_EQ(y.roles, (std::vector<std::string>{"ps", "", "worker"}));
  EXPECT_EQ(back->get_as<int64_t>(2), 9);
  // Lists cross as message elements of their own too.
  auto lists = roundTrip(caf::make_message(std::vector<uint64_t>{3, 4}, std::vector<std::string>{"a"}));
  ASSERT_TRUE(lists.hasValue()) << lists.status().message();
  EXPECT_EQ(lists->get_as<std::vector<uint64_t>>(0), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(lists->get_as<std::vector<std::string>>(1), (std::vector<std::string>{"a"}));
}

TEST(MessageCodec, RecordsOfUnlistedOrMismatchedTypesAreRefused) {
  WireTypes sender, receiver;
  sender.add<Pair>("test.Pair");
  // Not listed by the sender: refused on encode, naming the element.
  auto unlisted = roundTrip(caf::make_message(Everything{}), &sender, &sender);
  ASSERT_FALSE(unlisted.hasValue());
  EXPECT_EQ(unlisted.status().code(), Status::Code::kInvalidArgument);
  // Not listed by the receiver: dropped on decode.
  auto unknown = roundTrip(caf::make_message(Pair{1, "x"}), &sender, &receiver);
  ASSERT_FALSE(unknown.hasValue());
  EXPECT_NE(unknown.status().message().find("unknown type"), std::string::npos) << unknown.status().message();
  // The receiver has another shape under the same name: the fields are
  // checked one by one, and a missing or extra one is named.
  for (int shape = 0; shape < 3; ++shape) {
    WireTypes other;
    if (shape == 0) other.add<Swapped>("test.Pair");
    if (shape == 1) other.add<Short>("test.Pair");
    if (shape == 2) other.add<Long>("test.Pair");
    auto r = roundTrip(caf::make_message(Pair{1, "x"}), &sender, &other);
    ASSERT_FALSE(r.hasValue()) << shape;
    EXPECT_EQ(r.status().code(), Status::Code::kCorruption);
    const std::string why = r.status().message();
    EXPECT_NE(why.find("test.Pair"), std::string::npos) << why;
    if (shape == 0) EXPECT_NE(why.find("field 0 is a int64, not the text"), std::string::npos) << why;
    if (shape == 1) EXPECT_NE(why.find("1 more than it should"), std::string::npos) << why;
    if (shape == 2) EXPECT_NE(why.find("field 2 is missing"), std::string::npos) << why;
  }
  // A type or a name listed twice is a set-up error.
  EXPECT_THROW(WireTypes().add<Pair>("a").add<Pair>("b"), SetupError);
  EXPECT_THROW(WireTypes().add<Pair>("a").add<Short>("a"), SetupError);
}

TEST(MessageCodec, RefusesTypesThatCannotCrossProcesses) {
  std::vector<Tensor> tensors;
  std::string body;
  Status st = encodeMessage(caf::make_message(std::vector<int>{1}), &body, &tensors);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  // A body the receiver would drop is refused where it is made.
  st = encodeMessage(caf::make_message(std::string(kMaxMessageBodyBytes, 'x')), &body, &tensors);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("send bulk data as tensors"), std::string::npos) << st.message();
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
