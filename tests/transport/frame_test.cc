// Frames: round trips, and every kind of broken input refused with an error
// (never a crash or an out-of-bounds read: the suite also runs under ASan).
#include "transport/frame.h"

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "common/hash.h"

namespace troupe::transport {
namespace {

std::vector<std::byte> bytesOf(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng.next() & 0xff);
  return v;
}

Envelope sample() {
  Envelope e;
  e.sourceNode = 3;
  e.sourceActor = 0x1234567890ULL;
  e.destActor = 42;
  e.requestId = ~0ULL;
  e.kind = 7;
  e.body = std::string("pull\0keys", 9);
  return e;
}

TEST(FrameTest, RoundTripWithTensorsOfEverySize) {
  for (size_t count : {0, 1, 3}) {
    std::vector<std::vector<std::byte>> buffers;
    std::vector<TensorView> views;
    for (size_t i = 0; i < count; ++i) {
      buffers.push_back(bytesOf(i == 1 ? 0 : 1000 * i + 13, i));  // includes an empty tensor
      views.push_back({buffers.back().data(), buffers.back().size(), DType::kFloat32});
    }
    auto frame = encodeFrame(sample(), views);
    auto decoded = decodeFrame(frame.data(), frame.size());
    ASSERT_TRUE(decoded.hasValue()) << decoded.status().toString();
    const Envelope& e = decoded->envelope;
    EXPECT_EQ(e.sourceNode, 3u);
    EXPECT_EQ(e.sourceActor, 0x1234567890ULL);
    EXPECT_EQ(e.destActor, 42u);
    EXPECT_EQ(e.requestId, ~0ULL);
    EXPECT_EQ(e.kind, 7);
    EXPECT_EQ(e.body, std::string("pull\0keys", 9));
    ASSERT_EQ(decoded->tensors.size(), count);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(decoded->tensors[i].bytes, buffers[i].size());
      EXPECT_EQ(decoded->tensors[i].dtype, DType::kFloat32);
      EXPECT_EQ(std::memcmp(decoded->tensors[i].data, buffers[i].data(), buffers[i].size()), 0);
    }
  }
}

TEST(FrameTest, EveryTruncationIsAnError) {
  auto t = bytesOf(100, 9);
  auto frame = encodeFrame(sample(), {{t.data(), t.size(), DType::kBytes}});
  for (size_t n = 0; n < frame.size(); ++n) {
    auto copy = std::vector<std::byte>(frame.begin(), frame.begin() + n);  // exact size: ASan sees overreads
    auto d = decodeFrame(copy.data(), copy.size());
    EXPECT_FALSE(d.hasValue()) << "prefix of " << n << " bytes decoded";
    if (!d.hasValue()) EXPECT_EQ(d.status().code(), Status::Code::kCorruption);
  }
  // And trailing garbage is refused too.
  frame.push_back(std::byte{0});
  EXPECT_FALSE(decodeFrame(frame.data(), frame.size()).hasValue());
}

TEST(FrameTest, HeaderLiesAreCaught) {
  auto frame = encodeFrame(sample(), {});
  auto patched = [&](size_t at, uint32_t v) {
    auto f = frame;
    for (int i = 0; i < 4; ++i) f[at + i] = std::byte((v >> (8 * i)) & 0xff);
    return decodeFrame(f.data(), f.size());
  };
  auto d = patched(0, 0xdeadbeef);
  ASSERT_FALSE(d.hasValue());
  EXPECT_NE(d.status().message().find("bad frame magic 0xdeadbeef"), std::string::npos);
  d = patched(4, 12);  // not a multiple of 8
  ASSERT_FALSE(d.hasValue());
  EXPECT_NE(d.status().message().find("bad envelope length 12"), std::string::npos);
  d = patched(4, 0xfffffff8);  // larger than the frame and the limit
  EXPECT_FALSE(d.hasValue());
}

TEST(FrameTest, TensorLengthsBeyondTheFrameAreCaught) {
  auto t = bytesOf(64, 1);
  // An envelope that announces 64 bytes while only 63 follow.
  auto header = encodeEnvelope(sample(), {{t.data(), t.size(), DType::kBytes}});
  header.insert(header.end(), t.begin(), t.end() - 1);
  // The checksum (over the whole 64 bytes) refuses it first ...
  auto d = decodeFrame(header.data(), header.size());
  ASSERT_FALSE(d.hasValue());
  EXPECT_NE(d.status().message().find("checksum mismatch"), std::string::npos) << d.status().toString();
  // ... and the structural checks behind it do too.
  d = decodeFrame(header.data(), header.size(), false);
  ASSERT_FALSE(d.hasValue());
  EXPECT_NE(d.status().message().find("tensor 0 of 64 bytes runs past the frame"), std::string::npos)
      << d.status().toString();
}

TEST(FrameTest, EveryFlippedBitIsRefused) {
  auto t = bytesOf(300, 5);
  auto u = bytesOf(5, 6);
  const auto frame = encodeFrame(sample(), {{t.data(), t.size(), DType::kFloat32}, {u.data(), u.size(), DType::kBytes}});
  ASSERT_TRUE(decodeFrame(frame.data(), frame.size()).hasValue());
  size_t refused = 0;
  for (size_t bit = 0; bit < frame.size() * 8; ++bit) {
    auto f = frame;
    f[bit / 8] ^= std::byte(1u << (bit % 8));
    auto d = decodeFrame(f.data(), f.size());
    ASSERT_FALSE(d.hasValue()) << "bit " << bit << " flipped and the frame decoded";
    EXPECT_EQ(d.status().code(), Status::Code::kCorruption);
    ++refused;
  }
  EXPECT_EQ(refused, frame.size() * 8);
}

TEST(FrameTest, TheChecksumIsCrc32cAndChains) {
  // The CRC-32C check value of "123456789" (RFC 3720, B.4) is e3069283:
  // ISA-L's crc32_iscsi leaves the final inversion to the caller.
  const char* digits = "123456789";
  EXPECT_EQ(~frameCrc(digits, 9, ~0u), 0xe3069283u);
  auto a = bytesOf(1000, 1);
  EXPECT_EQ(frameCrc(a.data() + 400, 600, frameCrc(a.data(), 400)), frameCrc(a.data(), 1000));
}

TEST(FrameTest, GarbageNeverCrashes) {
  // Random bytes, and random bytes behind a valid header and length.
  auto frame = encodeFrame(sample(), {});
  for (uint64_t seed = 0; seed < 3000; ++seed) {
    auto g = bytesOf(8 + (seed % 300), seed);
    (void)decodeFrame(g.data(), g.size());
    if (g.size() >= frame.size()) {
      std::memcpy(g.data(), frame.data(), 8);
      auto d = decodeFrame(g.data(), g.size(), false);
      if (d.hasValue()) {
        size_t total = 0;
        for (const auto& t : d->tensors) total += t.bytes;
        EXPECT_LE(total, g.size());
      }
    }
    // A valid frame with one byte flipped.
    auto f = frame;
    f[seed % f.size()] ^= std::byte(1u << (seed % 8));
    (void)decodeFrame(f.data(), f.size());
    (void)decodeFrame(f.data(), f.size(), false);
  }
}

}  // namespace
}  // namespace troupe::transport
