// Frames: round trips, and every kind of broken input refused with an error
// (never a crash or an out-of-bounds read: the suite also runs under ASan).
#include "transport/frame.h"

#include <cstring>
#include <vector>

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/hash.h"

namespace troupe::transport {
namespace {

std::vector<std::byte> bytesOf(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng.next() & 0xff);
  return v;
}

// Structural checks only: no CRC, no seal.
const FrameCheck kStructureOnly{Integrity::kCrc32c, nullptr, false};

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
  d = decodeFrame(header.data(), header.size(), kStructureOnly);
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
      std::memset(g.data() + 12, 0, 4);  // a crc32c frame's integrity word
      auto d = decodeFrame(g.data(), g.size(), kStructureOnly);
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
    (void)decodeFrame(f.data(), f.size(), kStructureOnly);
  }
}

// ---------------------------------------------------------------- integrity

const FrameKey kKey = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                       17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

// A sealed frame as the node sends it: the envelope, each tensor as its own
// buffer, the seal; laid end to end as the receiver sees them.
std::vector<std::byte> sealedFrame(const FrameMac& mac, uint64_t seq, const std::vector<TensorView>& views) {
  auto head = encodeEnvelope(sample(), views, Integrity::kHmac);
  const auto seal = mac.seal(seq, head.data(), head.size(), views);
  std::vector<std::byte> frame = head;
  for (const auto& v : views) {
    frame.insert(frame.end(), v.data, v.data + v.bytes);
    frame.resize(frame.size() + paddedTensorBytes(v.bytes) - v.bytes);
  }
  frame.insert(frame.end(), seal.begin(), seal.end());
  return frame;
}

TEST(FrameIntegrityTest, TheSealIsHmacSha256OverEveryByteBeforeIt) {
  const FrameMac mac(kKey);
  auto t = bytesOf(1001, 3);
  auto u = bytesOf(0, 4);
  auto w = bytesOf(4096, 5);
  const std::vector<TensorView> views = {{t.data(), t.size(), DType::kFloat32},
                                         {u.data(), u.size(), DType::kBytes},
                                         {w.data(), w.size(), DType::kInt64}};
  const auto frame = sealedFrame(mac, 77, views);
  // The seal: the number (little-endian), then OpenSSL's one-shot HMAC over
  // all that precedes the MAC, the number included.
  ASSERT_GE(frame.size(), kSealBytes);
  uint64_t seq = 0;
  for (int i = 0; i < 8; ++i) seq |= uint64_t(frame[frame.size() - kSealBytes + size_t(i)]) << (8 * i);
  EXPECT_EQ(seq, 77u);
  unsigned char want[32];
  unsigned int length = 0;
  ASSERT_NE(HMAC(EVP_sha256(), kKey.data(), int(kKey.size()), reinterpret_cast<const unsigned char*>(frame.data()),
                 frame.size() - 32, want, &length),
            nullptr);
  ASSERT_EQ(length, 32u);
  EXPECT_EQ(std::memcmp(want, frame.data() + frame.size() - 32, 32), 0);
  // The header says hmac and carries no CRC.
  EXPECT_EQ(frameIntegrityWord(frame.data(), frame.size()), uint32_t(Integrity::kHmac));
  for (size_t i = 8; i < 12; ++i) EXPECT_EQ(frame[i], std::byte{0});

  auto d = decodeFrame(frame.data(), frame.size(), FrameCheck{Integrity::kHmac, &mac, true});
  ASSERT_TRUE(d.hasValue()) << d.status().toString();
  EXPECT_EQ(d->sealSeq, 77u);
  EXPECT_EQ(d->envelope.body, sample().body);
  ASSERT_EQ(d->tensors.size(), 3u);
  EXPECT_EQ(std::memcmp(d->tensors[0].data, t.data(), t.size()), 0);
  EXPECT_EQ(d->tensors[1].bytes, 0u);
  EXPECT_EQ(std::memcmp(d->tensors[2].data, w.data(), w.size()), 0);
  // A whole frame sealed at once is the same frame.
  auto whole = encodeFrame(sample(), views, Integrity::kHmac);
  const auto seal = mac.seal(77, whole.data(), whole.size());
  whole.insert(whole.end(), seal.begin(), seal.end());
  EXPECT_EQ(whole, frame);
}

TEST(FrameIntegrityTest, EveryFlippedBitOfASealedFrameIsRefused) {
  const FrameMac mac(kKey);
  auto t = bytesOf(100, 8);
  const auto frame = sealedFrame(mac, 5, {{t.data(), t.size(), DType::kFloat32}});
  ASSERT_TRUE(decodeFrame(frame.data(), frame.size(), FrameCheck{Integrity::kHmac, &mac, true}).hasValue());
  size_t refused = 0;
  for (size_t bit = 0; bit < frame.size() * 8; ++bit) {
    auto f = frame;
    f[bit / 8] ^= std::byte(1u << (bit % 8));
    auto d = decodeFrame(f.data(), f.size(), FrameCheck{Integrity::kHmac, &mac, true});
    ASSERT_FALSE(d.hasValue()) << "bit " << bit << " flipped and the sealed frame decoded";
    EXPECT_EQ(d.status().code(), Status::Code::kCorruption);
    ++refused;
  }
  EXPECT_EQ(refused, frame.size() * 8);
}

TEST(FrameIntegrityTest, AFrameMustCarryItsConnectionsGuardAndKey) {
  const FrameMac mac(kKey), other(FrameKey{9});
  auto t = bytesOf(64, 9);
  const std::vector<TensorView> views = {{t.data(), t.size(), DType::kBytes}};
  const auto sealed = sealedFrame(mac, 1, views);
  auto d = decodeFrame(sealed.data(), sealed.size(), FrameCheck{Integrity::kHmac, &other, true});
  ASSERT_FALSE(d.hasValue());
  EXPECT_NE(d.status().message().find("does not verify"), std::string::npos) << d.status().toString();
  d = decodeFrame(sealed.data(), sealed.size());  // a crc32c connection
  ASSERT_FALSE(d.hasValue());
  EXPECT_NE(d.status().message().find("guarded by hmac where crc32c is required"), std::string::npos)
      << d.status().toString();
  // A CRC'd frame (a forger without the key) where a seal is required.
  const auto crc = encodeFrame(sample(), views);
  d = decodeFrame(crc.data(), crc.size(), FrameCheck{Integrity::kHmac, &mac, true});
  ASSERT_FALSE(d.hasValue());
  EXPECT_NE(d.status().message().find("guarded by crc32c where hmac is required"), std::string::npos);
  // An unknown integrity word.
  auto odd = crc;
  odd[12] = std::byte{7};
  d = decodeFrame(odd.data(), odd.size());
  ASSERT_FALSE(d.hasValue());
  EXPECT_NE(d.status().message().find("guarded by unknown (0x00000007)"), std::string::npos);
  // A sealed frame cut short of its seal.
  d = decodeFrame(sealed.data(), kFrameHeaderBytes + 8, FrameCheck{Integrity::kHmac, &mac, true});
  ASSERT_FALSE(d.hasValue());
  EXPECT_NE(d.status().message().find("shorter than its header and seal"), std::string::npos);
}

TEST(FrameIntegrityTest, OffChecksNothingAndSaysSo) {
  auto t = bytesOf(256, 10);
  const std::vector<TensorView> views = {{t.data(), t.size(), DType::kFloat32}};
  auto off = encodeFrame(sample(), views, Integrity::kOff);
  EXPECT_EQ(frameIntegrityWord(off.data(), off.size()), uint32_t(Integrity::kOff));
  for (size_t i = 8; i < 12; ++i) EXPECT_EQ(off[i], std::byte{0});
  ASSERT_TRUE(decodeFrame(off.data(), off.size(), FrameCheck{Integrity::kOff, nullptr, true}).hasValue());
  // A flipped payload bit goes through: off is for networks that do not flip bits.
  off[off.size() - 100] ^= std::byte{1};
  auto d = decodeFrame(off.data(), off.size(), FrameCheck{Integrity::kOff, nullptr, true});
  ASSERT_TRUE(d.hasValue());
  EXPECT_NE(std::memcmp(d->tensors[0].data, t.data(), t.size()), 0);
  // But not where a CRC is required, nor a non-zero check word.
  EXPECT_FALSE(decodeFrame(off.data(), off.size()).hasValue());
  off[8] = std::byte{1};
  d = decodeFrame(off.data(), off.size(), FrameCheck{Integrity::kOff, nullptr, true});
  ASSERT_FALSE(d.hasValue());
  EXPECT_NE(d.status().message().find("check word"), std::string::npos);
}

TEST(FrameIntegrityTest, ReguardingACrcFrameGivesTheFrameTheSenderWouldHaveMade) {
  const FrameMac mac(kKey);
  auto t = bytesOf(40, 11);
  const std::vector<TensorView> views = {{t.data(), t.size(), DType::kBytes}};
  auto frame = encodeFrame(sample(), views);
  reguardFrame(&frame, Integrity::kHmac, &mac, 9);
  EXPECT_EQ(frame, sealedFrame(mac, 9, views));
  auto off = encodeFrame(sample(), views);
  reguardFrame(&off, Integrity::kOff, nullptr, 0);
  EXPECT_EQ(off, encodeFrame(sample(), views, Integrity::kOff));
}

TEST(FrameIntegrityTest, TheSealWindowRefusesReplaysAndTakesLateFrames) {
  SealWindow w;
  for (uint64_t s = 1; s <= 10; ++s) EXPECT_TRUE(w.accept(s).isOk()) << s;
  Status st = w.accept(5);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("seen before"), std::string::npos);
  EXPECT_TRUE(w.accept(20).isOk());
  EXPECT_TRUE(w.accept(15).isOk());   // late, never seen
  EXPECT_FALSE(w.accept(15).isOk());  // and now seen
  EXPECT_FALSE(w.accept(0).isOk());
  // A jump of the whole span forgets everything below it.
  const uint64_t top = 20 + SealWindow::kSpan;
  EXPECT_TRUE(w.accept(top).isOk());
  st = w.accept(20);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("older than the window"), std::string::npos);
  EXPECT_TRUE(w.accept(21).isOk());  // the oldest number still in the window
  EXPECT_FALSE(w.accept(21).isOk());
  // Numbers in the window that an advance passed over are new.
  EXPECT_TRUE(w.accept(top + 3).isOk());
  EXPECT_TRUE(w.accept(top + 1).isOk());
  EXPECT_TRUE(w.accept(top + 2).isOk());
  EXPECT_FALSE(w.accept(top + 2).isOk());
  // 100 000 numbers in order, each once: all taken; all refused again.
  SealWindow v;
  size_t taken = 0, refused = 0;
  for (uint64_t s = 1; s <= 100000; ++s) taken += v.accept(s).isOk();
  for (uint64_t s = 100000 - SealWindow::kSpan + 1; s <= 100000; ++s) refused += !v.accept(s).isOk();
  EXPECT_EQ(taken, 100000u);
  EXPECT_EQ(refused, SealWindow::kSpan);
}

TEST(FrameIntegrityTest, TheSealWindowAtTheEndOfTheNumbers) {
  const uint64_t top = ~uint64_t{0};
  SealWindow w;
  EXPECT_TRUE(w.accept(top - 5).isOk());
  EXPECT_TRUE(w.accept(top - 1).isOk());
  EXPECT_TRUE(w.accept(top).isOk());  // an advance that ends at the last number
  EXPECT_TRUE(w.accept(top - 3).isOk());
  EXPECT_FALSE(w.accept(top).isOk());
  EXPECT_FALSE(w.accept(top - 5).isOk());
}

TEST(FrameIntegrityTest, TheNodesWayStructureThenSealAgreesWithDecodingAtOnce) {
  const FrameMac mac(kKey), other(FrameKey{3});
  auto t = bytesOf(3000, 12);
  const auto frame = sealedFrame(mac, 11, {{t.data(), t.size(), DType::kFloat32}});
  // Structure only: decodes, with its number, whatever the key.
  auto d = decodeFrame(frame.data(), frame.size(), FrameCheck{Integrity::kHmac, nullptr, false});
  ASSERT_TRUE(d.hasValue()) << d.status().toString();
  EXPECT_EQ(d->sealSeq, 11u);
  EXPECT_TRUE(mac.verify(frame.data(), frame.size()));
  EXPECT_FALSE(other.verify(frame.data(), frame.size()));
  EXPECT_FALSE(mac.verify(frame.data(), frame.size() - 1));
  EXPECT_FALSE(mac.verify(frame.data(), kSealBytes - 1));
  // Decoding at once (structure and seal) gives the same frame.
  auto whole = decodeFrame(frame.data(), frame.size(), FrameCheck{Integrity::kHmac, &mac, true});
  ASSERT_TRUE(whole.hasValue());
  EXPECT_EQ(whole->sealSeq, d->sealSeq);
  EXPECT_EQ(whole->envelope.body, d->envelope.body);
  ASSERT_EQ(whole->tensors.size(), 1u);
  EXPECT_EQ(whole->tensors[0].data, d->tensors[0].data);
  // The tensor's last byte flipped: the structure still decodes; the seal does not verify.
  auto f = frame;
  f[f.size() - kSealBytes - 1 - (paddedTensorBytes(3000) - 3000)] ^= std::byte{0x10};
  auto fd = decodeFrame(f.data(), f.size(), FrameCheck{Integrity::kHmac, nullptr, false});
  ASSERT_TRUE(fd.hasValue());
  EXPECT_NE(std::memcmp(fd->tensors[0].data, t.data(), t.size()), 0);
  EXPECT_FALSE(mac.verify(f.data(), f.size()));
  EXPECT_FALSE(decodeFrame(f.data(), f.size(), FrameCheck{Integrity::kHmac, &mac, true}).hasValue());
  // An envelope longer than what is left before the seal: refused before any hash.
  auto g = frame;
  const uint32_t tooLong = uint32_t(g.size() - kFrameHeaderBytes - kSealBytes + 8);
  for (int i = 0; i < 4; ++i) g[4 + size_t(i)] = std::byte((tooLong >> (8 * i)) & 0xff);
  d = decodeFrame(g.data(), g.size(), FrameCheck{Integrity::kHmac, nullptr, false});
  ASSERT_FALSE(d.hasValue());
  EXPECT_NE(d.status().message().find("does not fit the"), std::string::npos) << d.status().toString();
}

TEST(FrameIntegrityTest, IntegrityNamesRoundTrip) {
  for (Integrity i : {Integrity::kOff, Integrity::kCrc32c, Integrity::kHmac}) {
    auto p = parseIntegrity(integrityName(i));
    ASSERT_TRUE(p.hasValue());
    EXPECT_EQ(*p, i);
  }
  auto bad = parseIntegrity("sha1");
  ASSERT_FALSE(bad.hasValue());
  EXPECT_EQ(bad.status().message(), "'sha1' is not one of off, crc32c, hmac");
}

}  // namespace
}  // namespace troupe::transport
