// The gradient codecs (kernels/codec.h): what each sends and what it keeps
// back (error feedback), their error bounds, determinism for a seed, and
// refusal of malformed encodings with an error, never a crash. Expected
// values are worked out by hand or from the definitions.
#include "kernels/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "common/check.h"
#include "common/hash.h"

namespace troupe::kernels {
namespace {

std::unique_ptr<Codec> codec(CodecKind kind, double fraction = 0.01, int64_t chunk = 256, uint64_t seed = 1) {
  CodecOptions o;
  o.kind = kind;
  o.fraction = fraction;
  o.chunk = chunk;
  o.seed = seed;
  return makeCodec(o);
}

std::vector<float> decoded(const Codec& c, const std::vector<std::byte>& bytes, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), -7.0f);
  Status s = c.decode(bytes.data(), bytes.size(), n, out.data(), false);
  EXPECT_TRUE(s.isOk()) << s.message();
  return out;
}

std::vector<float> randomValues(int64_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = float(rng.normal() * scale);
  return v;
}

TEST(Codec, NamesAndOptions) {
  for (auto k : {CodecKind::kNone, CodecKind::kFp16, CodecKind::kBf16, CodecKind::kInt8, CodecKind::kOneBit,
                 CodecKind::kTopK, CodecKind::kRandomK}) {
    EXPECT_EQ(codecKindOf(codecName(k)), k);
  }
  EXPECT_FALSE(codecKindOf("gzip"));
  EXPECT_THROW(codec(CodecKind::kTopK, 0.0), SetupError);
  EXPECT_THROW(codec(CodecKind::kTopK, 1.5), SetupError);
  EXPECT_THROW(codec(CodecKind::kInt8, 0.01, 0), SetupError);
}

TEST(Codec, CastsRoundToNearestAndKeepTheRestInTheResidual) {
  auto fp16 = codec(CodecKind::kFp16), bf16 = codec(CodecKind::kBf16);
  // 0.1f is 0x3dcccccd: as fp16 0x2e66 = 0.0999755859375, as bf16 0x3dcd = 0.10009765625.
  const std::vector<float> x = {0.1f, 1.0f, -2.5f, 70000.0f, 0.0f};
  std::vector<float> r(x.size(), 0.0f);
  std::vector<std::byte> bytes;
  ASSERT_TRUE(fp16->encode(x.data(), int64_t(x.size()), r.data(), 0, &bytes).isOk());
  EXPECT_EQ(bytes.size(), kCodecHeaderBytes + 2 * x.size());
  EXPECT_EQ(bytes.size(), fp16->encodedBytes(int64_t(x.size())));
  auto d = decoded(*fp16, bytes, int64_t(x.size()));
  EXPECT_EQ(d[0], 0.0999755859375f);
  EXPECT_EQ(d[1], 1.0f);
  EXPECT_EQ(d[2], -2.5f);
  EXPECT_EQ(d[3], 65504.0f) << "beyond fp16's range: its largest";
  EXPECT_EQ(r[3], 70000.0f - 65504.0f) << "and the rest waits in the residual";
  EXPECT_EQ(r[0], 0.1f - 0.0999755859375f);
  EXPECT_EQ(r[1], 0.0f);
  std::fill(r.begin(), r.end(), 0.0f);
  ASSERT_TRUE(bf16->encode(x.data(), int64_t(x.size()), r.data(), 0, &bytes).isOk());
  d = decoded(*bf16, bytes, int64_t(x.size()));
  EXPECT_EQ(d[0], 0.10009765625f);
  EXPECT_EQ(d[3], 70144.0f) << "70000 to the nearest bf16 (8 bits of mantissa)";
  // Relative error bounds on many values: 2^-11 (fp16 normals), 2^-8 (bf16).
  const auto v = randomValues(5000, 3);
  std::vector<std::byte> b16, bb;
  ASSERT_TRUE(fp16->encode(v.data(), 5000, nullptr, 0, &b16).isOk());
  ASSERT_TRUE(bf16->encode(v.data(), 5000, nullptr, 0, &bb).isOk());
  const auto d16 = decoded(*fp16, b16, 5000), dbf = decoded(*bf16, bb, 5000);
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::fabs(v[i]) > 1e-4f) {
      EXPECT_LE(std::fabs(d16[i] - v[i]), std::fabs(v[i]) * 0x1p-11f) << i;
    }
    EXPECT_LE(std::fabs(dbf[i] - v[i]), std::fabs(v[i]) * 0x1p-8f) << i;
  }
}

TEST(Codec, Int8RoundsStochasticallyWithinOneStepOfItsChunksScaleAndWithoutBias) {
  auto c = codec(CodecKind::kInt8, 0.01, 100, 9);
  const int64_t n = 250;  // chunks of 100, 100, 50
  const auto v = randomValues(n, 5);
  std::vector<std::byte> bytes;
  ASSERT_TRUE(c->encode(v.data(), n, nullptr, 1, &bytes).isOk());
  EXPECT_EQ(bytes.size(), kCodecHeaderBytes + 3 * 4 + size_t(n));
  const auto d = decoded(*c, bytes, n);
  for (int64_t chunk = 0; chunk < 3; ++chunk) {
    float maxAbs = 0;
    for (int64_t i = chunk * 100; i < std::min(n, chunk * 100 + 100); ++i) maxAbs = std::max(maxAbs, std::fabs(v[size_t(i)]));
    const float scale = maxAbs / 127.0f;
    for (int64_t i = chunk * 100; i < std::min(n, chunk * 100 + 100); ++i) {
      EXPECT_LT(std::fabs(d[size_t(i)] - v[size_t(i)]), scale * 1.0001f) << i;
    }
  }
  // The same seed and step: the same bytes; another step: other roundings.
  std::vector<std::byte> again, other;
  ASSERT_TRUE(c->encode(v.data(), n, nullptr, 1, &again).isOk());
  ASSERT_TRUE(c->encode(v.data(), n, nullptr, 2, &other).isOk());
  EXPECT_EQ(again, bytes);
  EXPECT_NE(other, bytes);
  // Unbiased: over many steps the mean of the decoded values is the value.
  std::vector<double> mean(size_t(n), 0.0);
  constexpr int kSteps = 4000;
  for (int s = 0; s < kSteps; ++s) {
    ASSERT_TRUE(c->encode(v.data(), n, nullptr, uint64_t(100 + s), &bytes).isOk());
    const auto ds = decoded(*c, bytes, n);
    for (int64_t i = 0; i < n; ++i) mean[size_t(i)] += ds[size_t(i)] / double(kSteps);
  }
  for (int64_t i = 0; i < n; ++i) {
    // Each rounding is off by less than a scale step (about 3/127 here);
    // the mean of 4000 by a small fraction of it.
    EXPECT_NEAR(mean[size_t(i)], v[size_t(i)], 0.004) << i;
  }
}

TEST(Codec, OneBitSendsTheSignAndTheChunksMeanMagnitude) {
  auto c = codec(CodecKind::kOneBit, 0.01, 4);
  const std::vector<float> x = {1, -3, 2, -2, 0.5f, -1.5f};  // chunks {1,-3,2,-2} and {0.5,-1.5}
  std::vector<float> r(x.size(), 0.0f);
  std::vector<std::byte> bytes;
  ASSERT_TRUE(c->encode(x.data(), 6, r.data(), 0, &bytes).isOk());
  EXPECT_EQ(bytes.size(), kCodecHeaderBytes + 2 * 4 + 1);
  EXPECT_EQ(decoded(*c, bytes, 6), (std::vector<float>{2, -2, 2, -2, 1, -1}));
  EXPECT_EQ(r, (std::vector<float>{-1, -1, 0, 0, -0.5f, -0.5f}));
  // The residual goes into the next step: {1,-3,2,-2} + {-1,-1,0,0} =
  // {0,-4,2,-2}, mean 2; {0.5,-1.5} + {-0.5,-0.5} = {0,-2}, mean 1 (0 counts
  // as positive).
  ASSERT_TRUE(c->encode(x.data(), 6, r.data(), 1, &bytes).isOk());
  EXPECT_EQ(decoded(*c, bytes, 6), (std::vector<float>{2, -2, 2, -2, 1, -1}));
  EXPECT_EQ(r, (std::vector<float>{-2, -2, 0, 0, -1, -1}));
}

TEST(Codec, TopKSendsTheLargestMagnitudesExactlyAndKeepsTheRest) {
  auto c = codec(CodecKind::kTopK, 0.5);
  const std::vector<float> x = {0.1f, -5, 3, 0.2f, 4, -0.3f};
  std::vector<float> r(x.size(), 0.0f);
  std::vector<std::byte> bytes;
  ASSERT_TRUE(c->encode(x.data(), 6, r.data(), 0, &bytes).isOk());
  EXPECT_EQ(bytes.size(), kCodecHeaderBytes + 3 * 8);
  EXPECT_EQ(decoded(*c, bytes, 6), (std::vector<float>{0, -5, 3, 0, 4, 0}));
  EXPECT_EQ(r, (std::vector<float>{0.1f, 0, 0, 0.2f, 0, -0.3f}));
  // Equal magnitudes: the lower indices.
  const std::vector<float> ties = {1, -1, 1, -1};
  ASSERT_TRUE(c->encode(ties.data(), 4, nullptr, 0, &bytes).isOk());
  EXPECT_EQ(decoded(*c, bytes, 4), (std::vector<float>{1, -1, 0, 0}));
  // Accumulating adds to what is there.
  std::vector<float> sum = {1, 1, 1, 1};
  ASSERT_TRUE(c->decode(bytes.data(), bytes.size(), 4, sum.data(), true).isOk());
  EXPECT_EQ(sum, (std::vector<float>{2, 0, 1, 1}));
}

// Against a reference written out here (sort every index by magnitude,
// larger first, ties to the lower index; keep k; in index order), on
// values with many ties, for several fractions and lengths.
TEST(Codec, TopKChoosesWhatSortingEveryValueWouldChoose) {
  Rng rng(21);
  for (double fraction : {0.01, 0.1, 0.37, 0.9}) {
    for (int64_t n : {int64_t(1), int64_t(9), int64_t(100), int64_t(4097)}) {
      auto c = codec(CodecKind::kTopK, fraction);
      std::vector<float> x(static_cast<size_t>(n));
      for (auto& v : x) v = float(int(rng.next() % 7) - 3) * 0.5f;  // -1.5 .. 1.5: ties everywhere
      std::vector<std::byte> bytes;
      ASSERT_TRUE(c->encode(x.data(), n, nullptr, 0, &bytes).isOk());
      const int64_t k = std::max<int64_t>(1, int64_t(std::ceil(fraction * double(n))));
      std::vector<uint32_t> order(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) order[size_t(i)] = uint32_t(i);
      std::stable_sort(order.begin(), order.end(),
                       [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
      std::vector<uint32_t> want(order.begin(), order.begin() + std::min(k, n));
      std::sort(want.begin(), want.end());
      // The indices sent, as the encoding holds them (after the header).
      std::vector<uint32_t> sent(want.size());
      ASSERT_EQ(bytes.size(), kCodecHeaderBytes + want.size() * 8);
      std::memcpy(sent.data(), bytes.data() + kCodecHeaderBytes, sent.size() * 4);
      EXPECT_EQ(sent, want) << "fraction " << fraction << " n " << n;
    }
  }
  // Large values only where a strided sample does not look (the sample's
  // bound lets fewer than k through: the selection over every value), and
  // half the values exactly zero (the bound is 0: k or more at it).
  for (int pattern = 0; pattern < 2; ++pattern) {
    const int64_t n = 262144, k = 5000;
    auto c = codec(CodecKind::kTopK, double(k) / double(n));
    std::vector<float> x(static_cast<size_t>(n), 0.0f), r(static_cast<size_t>(n), 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      if (pattern == 0) x[size_t(i)] = i % 64 == 1 ? float(i % 977) + 10.0f : float(i % 5) * 0.01f;
      if (pattern == 1) x[size_t(i)] = i % 2 ? float(i % 13) * 0.1f : 0.0f;
    }
    std::vector<std::byte> bytes;
    ASSERT_TRUE(c->encode(x.data(), n, r.data(), 0, &bytes).isOk());
    std::vector<uint32_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[size_t(i)] = uint32_t(i);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    std::vector<uint32_t> want(order.begin(), order.begin() + k), sent(static_cast<size_t>(k));
    std::sort(want.begin(), want.end());
    std::memcpy(sent.data(), bytes.data() + kCodecHeaderBytes, sent.size() * 4);
    EXPECT_EQ(sent, want) << "pattern " << pattern;
    // What was not sent is in the residual, what was is not.
    std::vector<bool> isSent(static_cast<size_t>(n), false);
    for (uint32_t i : want) isSent[i] = true;
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += r[size_t(i)] != (isSent[size_t(i)] ? 0.0f : x[size_t(i)]) ? 1 : 0;
    EXPECT_EQ(wrong, 0) << "pattern " << pattern;
  }
}

// Chunks that are not a multiple of 8 values: a chunk ends inside a byte
// of signs and the next starts there (bit by bit), or on a byte (eight at
// a time): every value decodes to its chunk's mean magnitude with its sign.
TEST(Codec, OneBitChunksThatEndInsideAByteOfSigns) {
  for (int64_t chunk : {int64_t(12), int64_t(20), int64_t(3), int64_t(8)}) {
    CodecOptions o;
    o.kind = CodecKind::kOneBit;
    o.chunk = chunk;
    auto c = makeCodec(o);
    const int64_t n = 103;
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = (i % 3 == 0 ? -1.0f : 1.0f) * float(1 + i % 7);
    std::vector<std::byte> bytes;
    ASSERT_TRUE(c->encode(x.data(), n, nullptr, 0, &bytes).isOk());
    const std::vector<float> got = decoded(*c, bytes, n);
    for (int64_t b = 0; b < n; b += chunk) {
      const int64_t e = std::min(n, b + chunk);
      double sum = 0;
      for (int64_t i = b; i < e; ++i) sum += std::fabs(x[size_t(i)]);
      const float scale = float(sum / double(e - b));
      for (int64_t i = b; i < e; ++i) {
        EXPECT_EQ(got[size_t(i)], x[size_t(i)] < 0 ? -scale : scale) << "chunk " << chunk << " value " << i;
      }
    }
  }
}

// Floyd's sampling as its definition reads, with an ordered set: the
// indices randomIndices must draw, whichever way it keeps them.
std::vector<uint32_t> floyd(uint64_t seed, uint64_t step, int64_t n, int64_t k) {
  Rng rng(hashCombine(seed, step, uint64_t(n)));
  std::set<uint32_t> chosen;
  for (int64_t j = n - k; j < n; ++j) {
    const uint32_t t = uint32_t(rng.below(uint64_t(j) + 1));
    if (!chosen.insert(t).second) chosen.insert(uint32_t(j));
  }
  return {chosen.begin(), chosen.end()};
}

// A chunk whose largest magnitude is below 127 / FLT_MAX: 127 / max would
// overflow (and a zero times it be NaN). Every value still rounds to a step
// in range, a zero to 0, and the residual keeps exactly the rest.
TEST(Codec, Int8RoundsChunksOfTinyValuesInRange) {
  auto int8 = codec(CodecKind::kInt8, 0.01, 4);
  const std::vector<float> x = {0.0f, 1e-40f, -3e-39f, 0.0f, -0.0f, 1e-45f, 2e-39f, -1e-38f};
  std::vector<float> r(x.size(), 0.0f);
  std::vector<std::byte> bytes;
  ASSERT_TRUE(int8->encode(x.data(), int64_t(x.size()), r.data(), 0, &bytes).isOk());
  const int8_t* q = reinterpret_cast<const int8_t*>(bytes.data() + kCodecHeaderBytes + 2 * 4);
  EXPECT_EQ(q[0], 0) << "a zero rounds to 0";
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(q[4], 0);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_GE(q[i], -127) << i;
    EXPECT_LE(q[i], 127) << i;
    EXPECT_TRUE(q[i] == 0 || (q[i] > 0) == (x[i] > 0)) << "value " << i << " keeps its sign: " << int(q[i]);
  }
  const auto d = decoded(*int8, bytes, int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(d[i] + r[i], x[i]) << "value " << i << ": what was sent and what was kept (subnormal sums are exact)";
  }
}

TEST(Codec, RandomIndicesAreFloydsSampleBothWaysOfKeepingThem) {
  // Dense draws (a bitmap) and sparse ones (a hash set), and the edges.
  const int64_t cases[][2] = {{1000, 50}, {100000, 50}, {64, 64}, {1, 1}, {128 * 40, 40}, {128 * 40 + 1, 40},
                              {1 << 20, 10486}, {(1 << 20) + 3, 100}};
  for (const auto& c : cases) {
    for (uint64_t step : {uint64_t{0}, uint64_t{9}}) {
      EXPECT_EQ(randomIndices(5, step, c[0], c[1]), floyd(5, step, c[0], c[1])) << "n " << c[0] << " k " << c[1];
    }
  }
  EXPECT_EQ(randomIndices(5, 0, 10, 20).size(), 10u) << "k above n takes every index";
}

TEST(Codec, RandomKDrawsTheSameIndicesOnEveryRankForAStep) {
  const int64_t n = 1000;
  auto a = codec(CodecKind::kRandomK, 0.05, 256, 42), b = codec(CodecKind::kRandomK, 0.05, 256, 42);
  const auto idx = randomIndices(42, 7, n, 50);
  ASSERT_EQ(idx.size(), 50u);
  EXPECT_EQ(std::set<uint32_t>(idx.begin(), idx.end()).size(), 50u) << "distinct";
  EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end()));
  EXPECT_LT(idx.back(), uint32_t(n));
  EXPECT_EQ(randomIndices(42, 7, n, 50), idx);
  EXPECT_NE(randomIndices(42, 8, n, 50), idx);
  EXPECT_NE(randomIndices(43, 7, n, 50), idx);
  // Two ranks' encodings of the same step sum index by index.
  const auto x = randomValues(n, 1), y = randomValues(n, 2);
  std::vector<std::byte> bx, by;
  ASSERT_TRUE(a->encode(x.data(), n, nullptr, 7, &bx).isOk());
  ASSERT_TRUE(b->encode(y.data(), n, nullptr, 7, &by).isOk());
  EXPECT_EQ(bx.size(), kCodecHeaderBytes + 50 * 4);
  std::vector<float> sum(size_t(n), 0.0f);
  ASSERT_TRUE(a->decode(bx.data(), bx.size(), n, sum.data(), true).isOk());
  ASSERT_TRUE(b->decode(by.data(), by.size(), n, sum.data(), true).isOk());
  const std::set<uint32_t> chosen(idx.begin(), idx.end());
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(sum[size_t(i)], chosen.count(uint32_t(i)) ? x[size_t(i)] + y[size_t(i)] : 0.0f) << i;
  }
}

// Error feedback loses nothing: after T steps, what was sent plus what is
// still in the residual is everything that was to be sent.
TEST(Codec, ErrorFeedbackKeepsExactlyWhatWasNotSent) {
  for (auto kind : {CodecKind::kFp16, CodecKind::kBf16, CodecKind::kInt8, CodecKind::kOneBit, CodecKind::kTopK,
                    CodecKind::kRandomK}) {
    SCOPED_TRACE(codecName(kind));
    auto c = codec(kind, 0.1, 64, 3);
    const int64_t n = 300;
    std::vector<float> r(size_t(n), 0.0f);
    std::vector<double> fed(size_t(n), 0.0), sent(size_t(n), 0.0);
    std::vector<std::byte> bytes;
    for (int step = 0; step < 20; ++step) {
      const auto g = randomValues(n, uint64_t(1000 + step));
      // The residual out must be (g + r_in) - decoded, to the bit.
      const std::vector<float> before = r;
      ASSERT_TRUE(c->encode(g.data(), n, r.data(), uint64_t(step), &bytes).isOk());
      const auto d = decoded(*c, bytes, n);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(r[size_t(i)], (g[size_t(i)] + before[size_t(i)]) - d[size_t(i)]) << i;
        fed[size_t(i)] += g[size_t(i)];
        sent[size_t(i)] += d[size_t(i)];
      }
    }
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(sent[size_t(i)] + r[size_t(i)], fed[size_t(i)], 1e-3) << i;
  }
}

TEST(Codec, EveryCodecTakesNothingOneValueAndAPartChunk) {
  for (auto kind : {CodecKind::kNone, CodecKind::kFp16, CodecKind::kBf16, CodecKind::kInt8, CodecKind::kOneBit,
                    CodecKind::kTopK, CodecKind::kRandomK}) {
    SCOPED_TRACE(codecName(kind));
    auto c = codec(kind, 0.5, 8);
    for (int64_t n : {0, 1, 13}) {
      const auto v = randomValues(n, uint64_t(n) + 1);
      std::vector<std::byte> bytes;
      ASSERT_TRUE(c->encode(v.data(), n, nullptr, 0, &bytes).isOk()) << n;
      EXPECT_EQ(bytes.size(), c->encodedBytes(n)) << n;
      std::vector<float> out(static_cast<size_t>(n));
      EXPECT_TRUE(c->decode(bytes.data(), bytes.size(), n, out.data(), false).isOk()) << n;
    }
  }
}

TEST(Codec, AValueThatIsNotFiniteIsNotEncoded) {
  for (auto kind : {CodecKind::kFp16, CodecKind::kInt8, CodecKind::kOneBit, CodecKind::kTopK}) {
    auto c = codec(kind, 0.5, 8);
    std::vector<float> v = {1, 2, std::nanf(""), 4};
    std::vector<std::byte> bytes;
    Status s = c->encode(v.data(), 4, nullptr, 0, &bytes);
    EXPECT_FALSE(s.isOk()) << codecName(kind);
    EXPECT_NE(s.message().find("value 2 of 4 to encode is not finite"), std::string::npos) << s.message();
  }
}

// Encodings arrive from the network: every malformed one is refused with
// an error naming what is wrong.
TEST(Codec, MalformedEncodingsAreRefusedNamingWhatIsWrong) {
  auto top = codec(CodecKind::kTopK, 0.5), i8 = codec(CodecKind::kInt8, 0.01, 4), one = codec(CodecKind::kOneBit, 0.01, 4);
  const std::vector<float> x = {0.1f, -5, 3, 0.2f, 4, -0.3f};
  std::vector<std::byte> t, q, b;
  ASSERT_TRUE(top->encode(x.data(), 6, nullptr, 0, &t).isOk());
  ASSERT_TRUE(i8->encode(x.data(), 6, nullptr, 0, &q).isOk());
  ASSERT_TRUE(one->encode(x.data(), 6, nullptr, 0, &b).isOk());
  std::vector<float> out(6);
  auto refusal = [&](const Codec& c, std::vector<std::byte> bytes, int64_t n = 6) {
    Status s = c.decode(bytes.data(), bytes.size(), n, out.data(), false);
    return s.isOk() ? std::string("accepted") : s.message();
  };
  auto with = [](std::vector<std::byte> bytes, size_t at, std::vector<uint8_t> put) {
    for (size_t i = 0; i < put.size(); ++i) bytes[at + i] = std::byte(put[i]);
    return bytes;
  };
  EXPECT_NE(refusal(*top, {t.begin(), t.begin() + 10}).find("fewer than the 32-byte header"), std::string::npos);
  EXPECT_NE(refusal(*top, with(t, 0, {0, 0, 0, 0})).find("not an encoded gradient"), std::string::npos);
  EXPECT_NE(refusal(*top, with(t, 5, {9})).find("encoding version 9"), std::string::npos);
  EXPECT_NE(refusal(*i8, t).find("encoded by codec topk"), std::string::npos);
  EXPECT_NE(refusal(*top, t, 7).find("holds 6 values, 7 expected"), std::string::npos);
  EXPECT_NE(refusal(*top, with(t, 6, {1})).find("reserved header fields set"), std::string::npos);
  EXPECT_NE(refusal(*top, with(t, 16, {2})).find("the encoding's k is 2, 3 expected"), std::string::npos);
  auto longer = t;
  longer.push_back(std::byte(0));
  EXPECT_NE(refusal(*top, longer).find("25 bytes of payload, 24 expected"), std::string::npos);
  // topk's indices: out of range, repeated, decreasing.
  EXPECT_NE(refusal(*top, with(t, 32, {6, 0, 0, 0})).find("out of range"), std::string::npos);
  EXPECT_NE(refusal(*top, with(t, 36, {1, 0, 0, 0})).find("not above the one before"), std::string::npos);
  // A value that is not finite (a NaN's bits in the first value).
  EXPECT_NE(refusal(*top, with(t, 44, {0, 0, 0xc0, 0x7f})).find("value 0 is not finite"), std::string::npos);
  // int8: a scale that is negative or NaN, a -128.
  EXPECT_NE(refusal(*i8, with(q, 32, {0, 0, 0x80, 0xbf})).find("chunk 0's scale is -1"), std::string::npos);
  EXPECT_NE(refusal(*i8, with(q, 32, {0, 0, 0xc0, 0x7f})).find("chunk 0's scale is nan"), std::string::npos);
  EXPECT_NE(refusal(*i8, with(q, 40, {0x80})).find("value 0 is -128"), std::string::npos);
  // onebit: bits past the values.
  EXPECT_NE(refusal(*one, with(b, 40, {0xff})).find("bits set past the 6 values"), std::string::npos);
  // Random damage to each codec's bytes: refused or decoded, never a crash
  // (and the header's damage always refused).
  for (auto kind : {CodecKind::kNone, CodecKind::kFp16, CodecKind::kBf16, CodecKind::kInt8, CodecKind::kOneBit,
                    CodecKind::kTopK, CodecKind::kRandomK}) {
    auto c = codec(kind, 0.1, 16);
    const auto v = randomValues(200, 11);
    std::vector<std::byte> good;
    ASSERT_TRUE(c->encode(v.data(), 200, nullptr, 0, &good).isOk());
    Rng rng(uint64_t(kind) + 100);
    std::vector<float> o(200);
    int refused = 0;
    for (int trial = 0; trial < 2000; ++trial) {
      auto bad = good;
      const size_t at = size_t(rng.below(bad.size()));
      bad[at] ^= std::byte(1u << rng.below(8));
      if (trial % 7 == 0) bad.resize(size_t(rng.below(bad.size())));
      const bool header = at < 24;  // (the step, bytes 24 to 31, only seeds randomk's draw)
      Status s = c->decode(bad.data(), bad.size(), 200, o.data(), false);
      refused += !s.isOk();
      if (header && bad.size() == good.size()) {
        EXPECT_FALSE(s.isOk()) << codecName(kind) << " byte " << at;
      }
    }
    EXPECT_GT(refused, 0) << codecName(kind);
  }
}

}  // namespace
}  // namespace troupe::kernels
