// The CUDA codecs (kernels/cuda/cuda_codec.h) against the CPU codecs on the
// same inputs: the same encoded bytes, the same residuals and the same
// decoded values, bit for bit; the casts and top-k's choice also against
// their definitions, worked out here; and refusal of malformed encodings
// with a Corruption before any write outside the output. Built only with
// CUDA; on a machine without a CUDA device every test skips, saying so.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "common/hash.h"
#include "kernels/codec.h"
#include "kernels/cuda/cuda_kernels.h"

namespace troupe::kernels {
namespace {

constexpr CodecKind kKinds[] = {CodecKind::kNone, CodecKind::kFp16,  CodecKind::kBf16,   CodecKind::kInt8,
                                CodecKind::kOneBit, CodecKind::kTopK, CodecKind::kRandomK};

// n floats of device memory and a guard of 64 more, filled with a pattern
// that no test writes: any write past n shows.
class DeviceFloats {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr float kPattern = -12345.5f;
  explicit DeviceFloats(const std::vector<float>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), (n_ + kGuard) * sizeof(float)), cudaSuccess);
    std::vector<float> all(host);
    all.resize(n_ + kGuard, kPattern);
    EXPECT_EQ(cudaMemcpy(p_, all.data(), all.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() { return p_; }
  std::vector<float> toHost() const {
    std::vector<float> all(n_ + kGuard);
    EXPECT_EQ(cudaMemcpy(all.data(), p_, all.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = n_; i < all.size(); ++i) EXPECT_EQ(all[i], kPattern) << "written past the " << n_ << " values";
    all.resize(n_);
    return all;
  }

 private:
  size_t n_;
  float* p_ = nullptr;
};

std::vector<float> randomValues(int64_t n, uint64_t seed, double scale) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = float(rng.normal() * scale);
  return v;
}

CodecOptions optionsOf(CodecKind kind, int64_t chunk = 256, double fraction = 0.01) {
  CodecOptions o;
  o.kind = kind;
  o.chunk = chunk;
  o.fraction = fraction;
  o.seed = 42;
  return o;
}

// Bitwise equality of two float vectors, naming the first difference.
void expectSameBits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    ASSERT_EQ(x, y) << what << ": value " << i << " is " << a[i] << " on the CPU, " << b[i] << " on the GPU";
  }
}

void expectSameBytes(const std::vector<std::byte>& a, const std::vector<std::byte>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(int(a[i]), int(b[i])) << what << ": byte " << i << " of " << a.size();
  }
}

class CudaCodecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::cudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }

  // Encodes x (with a residual r0 when given) on both, compares the bytes and
  // the residuals, then decodes the bytes on both into `prior` (replacing
  // and accumulating) and compares.
  void compare(const CodecOptions& o, const std::vector<float>& x, const std::vector<float>* r0, uint64_t step,
               const std::string& what) {
    const int64_t n = int64_t(x.size());
    auto cpu = makeCodec(o, Device::kCpu);
    auto gpu = makeCodec(o, Device::kCuda);
    std::vector<float> rCpu = r0 ? *r0 : std::vector<float>(x.size(), 0.0f);
    DeviceFloats dx(x), dr(rCpu);
    std::vector<std::byte> bCpu, bGpu;
    Status s = cpu->encode(x.data(), n, r0 ? rCpu.data() : nullptr, step, &bCpu);
    ASSERT_TRUE(s.isOk()) << what << ": " << s.message();
    s = gpu->encode(dx.get(), n, r0 ? dr.get() : nullptr, step, &bGpu);
    ASSERT_TRUE(s.isOk()) << what << ": " << s.message();
    ASSERT_EQ(bGpu.size(), gpu->encodedBytes(n)) << what;
    expectSameBytes(bCpu, bGpu, what + ", encoded");
    if (r0) expectSameBits(rCpu, dr.toHost(), what + ", residual");
    for (bool accumulate : {false, true}) {
      const std::vector<float> prior = randomValues(n, 99, 0.5);
      std::vector<float> outCpu = prior;
      DeviceFloats outGpu(prior);
      s = cpu->decode(bCpu.data(), bCpu.size(), n, outCpu.data(), accumulate);
      ASSERT_TRUE(s.isOk()) << what << ": " << s.message();
      s = gpu->decode(bCpu.data(), bCpu.size(), n, outGpu.get(), accumulate);
      ASSERT_TRUE(s.isOk()) << what << ": " << s.message();
      expectSameBits(outCpu, outGpu.toHost(), what + (accumulate ? ", decoded and added" : ", decoded"));
    }
  }
};

TEST_F(CudaCodecTest, EveryCodecWritesTheCpuBytesAndResidualsAndDecodesAlike) {
  int cases = 0;
  for (CodecKind kind : kKinds) {
    for (int64_t chunk : {int64_t{256}, int64_t{100}, int64_t{13}}) {
      if (chunk != 256 && kind != CodecKind::kInt8 && kind != CodecKind::kOneBit) continue;
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{255}, int64_t{256}, int64_t{1000}, int64_t{4097},
                        int64_t{100003}}) {
        for (bool residual : {false, true}) {
          for (uint64_t step : {uint64_t{0}, uint64_t{7}}) {
            const auto x = randomValues(n, uint64_t(n) * 31 + step, 1e-2);
            const auto r0 = randomValues(n, uint64_t(n) * 17 + 5, 1e-3);
            const std::string what = std::string(codecName(kind)) + " chunk " + std::to_string(chunk) + " n " +
                                     std::to_string(n) + (residual ? " with residual" : "") + " step " +
                                     std::to_string(step);
            compare(optionsOf(kind, chunk), x, residual ? &r0 : nullptr, step, what);
            if (HasFatalFailure()) return;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, (7 + 2 * 2) * 8 * 2 * 2);
}

TEST_F(CudaCodecTest, SignedZerosSubnormalsHugeValuesAndEdgeChunksAlike) {
  // Chunks of tiny values (int8's 127 / max overflows), subnormals, -0,
  // values past fp16's and near float's range, and the chunk sizes' edges.
  std::vector<float> x = {0.0f, -0.0f, 1e-40f, -3e-39f, 1e-45f, -1e-45f, 0.0f, 2e-38f,
                          1e30f, -7e4f, 65519.0f, 3e38f, -1.7e38f, 1.0f, -0.0f, 5e-39f};
  for (int i = 0; i < 300; ++i) x.push_back(float(i % 7) * 1e-41f * (i % 2 ? -1.0f : 1.0f));
  for (int64_t chunk : {int64_t{1}, int64_t{8}, int64_t{16}, int64_t{1} << 20}) {
    for (CodecKind kind : kKinds) {
      if (chunk != 16 && kind != CodecKind::kInt8 && kind != CodecKind::kOneBit) continue;
      const std::vector<float> r0(x.size(), 0.0f);
      compare(optionsOf(kind, chunk, 0.3), x, &r0, 3,
              std::string(codecName(kind)) + " special values, chunk " + std::to_string(chunk));
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(CudaCodecTest, TopKBreaksTiesAsTheCpuDoes) {
  // Few distinct magnitudes and many exact zeros: the k-th largest is
  // shared by many values, and the lower indices must win.
  const int64_t n = 50000;
  std::vector<float> x(static_cast<size_t>(n));
  Rng rng(3);
  for (auto& v : x) v = float(int(rng.below(5)) - 2) * 0.25f;
  for (double fraction : {0.01, 0.2, 0.5, 0.9, 1.0}) {
    compare(optionsOf(CodecKind::kTopK, 256, fraction), x, nullptr, 0, "ties, fraction " + std::to_string(fraction));
    if (HasFatalFailure()) return;
  }
  const std::vector<float> zeros(1000, 0.0f);
  compare(optionsOf(CodecKind::kTopK, 256, 0.05), zeros, nullptr, 0, "all zeros");
}

TEST_F(CudaCodecTest, CastsAndTopKAgreeWithTheirDefinitions) {
  const int64_t n = 3001;
  const auto x = randomValues(n, 11, 10.0);
  DeviceFloats dx(x);
  // fp16: each value rounded to the nearest half (the host's _Float16 cast),
  // the residual what that lost.
  {
    auto fp16 = makeCodec(optionsOf(CodecKind::kFp16), Device::kCuda);
    DeviceFloats dr(std::vector<float>(size_t(n), 0.0f));
    std::vector<std::byte> bytes;
    ASSERT_TRUE(fp16->encode(dx.get(), n, dr.get(), 0, &bytes).isOk());
    DeviceFloats out(std::vector<float>(size_t(n), 0.0f));
    ASSERT_TRUE(fp16->decode(bytes.data(), bytes.size(), n, out.get(), false).isOk());
    const auto d = out.toHost(), r = dr.toHost();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(d[size_t(i)], float(_Float16(x[size_t(i)]))) << i;
      ASSERT_EQ(r[size_t(i)], x[size_t(i)] - d[size_t(i)]) << i;
    }
  }
  // topk at 1%: the 31 largest magnitudes, ties to the lower index, sent
  // exactly; the rest 0.
  {
    auto topk = makeCodec(optionsOf(CodecKind::kTopK), Device::kCuda);
    std::vector<std::byte> bytes;
    ASSERT_TRUE(topk->encode(dx.get(), n, nullptr, 0, &bytes).isOk());
    DeviceFloats out(std::vector<float>(size_t(n), 5.0f));
    ASSERT_TRUE(topk->decode(bytes.data(), bytes.size(), n, out.get(), false).isOk());
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return std::fabs(x[size_t(a)]) > std::fabs(x[size_t(b)]); });
    std::vector<float> expected(static_cast<size_t>(n), 0.0f);
    for (int j = 0; j < 31; ++j) expected[size_t(order[size_t(j)])] = x[size_t(order[size_t(j)])];
    expectSameBits(expected, out.toHost(), "topk");
  }
}

TEST_F(CudaCodecTest, ValuesThatAreNotFiniteAreRefusedNamingTheFirst) {
  const int64_t n = 1000;
  auto x = randomValues(n, 5, 1.0);
  x[77] = std::nanf("");
  x[500] = INFINITY;
  DeviceFloats dx(x);
  for (CodecKind kind : kKinds) {
    auto gpu = makeCodec(optionsOf(kind, 256, 0.5), Device::kCuda);
    DeviceFloats dr(std::vector<float>(size_t(n), 0.0f));
    std::vector<std::byte> bytes;
    Status s = gpu->encode(dx.get(), n, dr.get(), 0, &bytes);
    ASSERT_EQ(s.code(), Status::Code::kInvalidArgument) << codecName(kind) << ": " << s.message();
    EXPECT_NE(s.message().find("value 77 of 1000"), std::string::npos) << s.message();
  }
}

TEST_F(CudaCodecTest, MalformedEncodingsAreRefusedBeforeAnyStrayWrite) {
  const int64_t n = 1003;
  const auto x = randomValues(n, 8, 1.0);
  struct Case {
    CodecKind kind;
    const char* what;
    size_t at;  // byte of the payload to change
    std::vector<uint8_t> bytes;
    const char* expect;
  };
  auto f32 = [](float v) {
    std::vector<uint8_t> b(4);
    std::memcpy(b.data(), &v, 4);
    return b;
  };
  auto u32 = [](uint32_t v) {
    std::vector<uint8_t> b(4);
    std::memcpy(b.data(), &v, 4);
    return b;
  };
  const size_t chunks = (n + 255) / 256;
  const std::vector<Case> cases = {
      {CodecKind::kNone, "a NaN", 40, f32(std::nanf("")), "not finite"},
      {CodecKind::kFp16, "an infinite half", 20, {0x00, 0x7c}, "not finite"},
      {CodecKind::kBf16, "a NaN bf16", 20, {0xc0, 0x7f}, "not finite"},
      {CodecKind::kInt8, "a NaN scale", 4, f32(std::nanf("")), "chunk 1's scale"},
      {CodecKind::kInt8, "a negative scale", 8, f32(-1.0f), "chunk 2's scale"},
      {CodecKind::kInt8, "a value of -128", chunks * 4 + 600, {0x80}, "value 600 is -128"},
      {CodecKind::kOneBit, "an infinite scale", 0, f32(INFINITY), "chunk 0's scale"},
      {CodecKind::kOneBit, "bits past the end", chunks * 4 + n / 8, {0xff}, "bits set past"},
      {CodecKind::kTopK, "an index out of range", 4 * 5, u32(5000), "index 5"},
      {CodecKind::kTopK, "indices out of order", 4 * 3, u32(0), "index 3"},
      {CodecKind::kTopK, "a NaN value", 11 * 4 + 4, f32(std::nanf("")), "value 1 is not finite"},
      {CodecKind::kRandomK, "an infinite value", 8, f32(-INFINITY), "value 2 is not finite"},
  };
  for (const Case& c : cases) {
    auto gpu = makeCodec(optionsOf(c.kind), Device::kCuda);
    auto cpu = makeCodec(optionsOf(c.kind), Device::kCpu);
    std::vector<std::byte> bytes;
    ASSERT_TRUE(cpu->encode(x.data(), n, nullptr, 3, &bytes).isOk());
    ASSERT_LE(kCodecHeaderBytes + c.at + c.bytes.size(), bytes.size()) << c.what;
    std::memcpy(bytes.data() + kCodecHeaderBytes + c.at, c.bytes.data(), c.bytes.size());
    DeviceFloats out(std::vector<float>(size_t(n), 1.0f));
    Status s = gpu->decode(bytes.data(), bytes.size(), n, out.get(), true);
    EXPECT_EQ(s.code(), Status::Code::kCorruption) << codecName(c.kind) << ", " << c.what << ": " << s.message();
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.what << ": " << s.message();
    out.toHost();  // the guard after the n values is untouched
    // The header's checks: one byte short, another codec's bytes.
    s = gpu->decode(bytes.data(), bytes.size() - 1, n, out.get(), true);
    EXPECT_EQ(s.code(), Status::Code::kCorruption) << c.what << ", short: " << s.message();
    std::vector<std::byte> other = bytes;
    other[4] = std::byte(uint8_t(c.kind == CodecKind::kNone ? CodecKind::kFp16 : CodecKind::kNone));
    s = gpu->decode(other.data(), other.size(), n, out.get(), true);
    EXPECT_EQ(s.code(), Status::Code::kCorruption) << c.what << ", kind: " << s.message();
  }
}

TEST_F(CudaCodecTest, TheSameSeedAndStepDrawTheSameBytes) {
  const int64_t n = 20000;
  const auto x = randomValues(n, 21, 1e-2);
  DeviceFloats dx(x);
  for (CodecKind kind : {CodecKind::kInt8, CodecKind::kRandomK}) {
    auto gpu = makeCodec(optionsOf(kind), Device::kCuda);
    std::vector<std::byte> a, b, c;
    ASSERT_TRUE(gpu->encode(dx.get(), n, nullptr, 4, &a).isOk());
    ASSERT_TRUE(gpu->encode(dx.get(), n, nullptr, 4, &b).isOk());
    ASSERT_TRUE(gpu->encode(dx.get(), n, nullptr, 5, &c).isOk());
    expectSameBytes(a, b, codecName(kind));
    // Another step draws other coins (int8) or indices (randomk): the
    // payloads differ.
    EXPECT_NE(std::memcmp(a.data() + kCodecHeaderBytes, c.data() + kCodecHeaderBytes, a.size() - kCodecHeaderBytes), 0)
        << codecName(kind);
  }
}

}  // namespace
}  // namespace troupe::kernels
