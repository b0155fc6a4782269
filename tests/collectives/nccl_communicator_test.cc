// The NCCL backend. Every build checks what it promises without a GPU: a
// build without NCCL says so, a build with NCCL on a machine without a CUDA
// device says that, and bad options are refused before any device is
// touched. On a machine with a CUDA device (the GPU cases skip, giving the
// reason, elsewhere): world size 1 on device and host buffers of every type
// against the CPU reference (collectives/reduce.h), the gathers and
// broadcast, two ranks when two devices are present, and a group that never
// forms failing by its health callback and by its timeout, not hanging.
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/nccl_communicator.h"
#include "collectives/reduce.h"
#include "troupe/config.h"

#if TROUPE_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace troupe::collectives {
namespace {

using namespace std::chrono_literals;

TEST(NcclCommunicatorTest, SaysWhyItIsUnavailable) {
  const std::string why = ncclUnavailableReason();
  EXPECT_EQ(ncclBuilt(), bool(TROUPE_HAVE_NCCL));
  if (!ncclBuilt()) {
    EXPECT_NE(why.find("built without NCCL"), std::string::npos) << why;
    EXPECT_FALSE(makeNcclId().hasValue());
  }
  if (why.empty()) GTEST_SKIP() << "NCCL is usable here; nothing to refuse";
  NcclOptions o;
  o.id.assign(kNcclIdBytes, '\0');
  auto c = createNcclCommunicator(o);
  ASSERT_FALSE(c.hasValue());
  EXPECT_EQ(c.status().code(), Status::Code::kUnavailable);
  EXPECT_NE(c.status().message().find(why), std::string::npos) << c.status().message();
}

TEST(NcclCommunicatorTest, RefusesBadOptionsBeforeTouchingADevice) {
  if (!ncclBuilt()) GTEST_SKIP() << "built without NCCL: every call says so (SaysWhyItIsUnavailable)";
  NcclOptions o;
  o.id = "short";
  auto c = createNcclCommunicator(o);
  ASSERT_FALSE(c.hasValue());
  EXPECT_NE(c.status().message().find("unique id has 5 bytes"), std::string::npos) << c.status().message();
  o.id.assign(kNcclIdBytes, '\0');
  o.rank = 2;
  o.size = 2;
  c = createNcclCommunicator(o);
  ASSERT_FALSE(c.hasValue());
  EXPECT_NE(c.status().message().find("rank 2 of a group of 2"), std::string::npos) << c.status().message();
}

TEST(NcclCommunicatorTest, MakesUniqueIdsWithoutADevice) {
  if (!ncclBuilt()) GTEST_SKIP() << "built without NCCL: makeNcclId says so (SaysWhyItIsUnavailable)";
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  auto a = makeNcclId();
  auto b = makeNcclId();
  ASSERT_TRUE(a.hasValue()) << a.status().message();
  ASSERT_TRUE(b.hasValue()) << b.status().message();
  EXPECT_EQ(a->size(), kNcclIdBytes);
  EXPECT_NE(*a, *b);
}

#if TROUPE_HAVE_NCCL

// A device buffer holding a copy of `host`.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(1, n_) * sizeof(T)), cudaSuccess);
    if (n_) EXPECT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  void* get() { return p_; }
  std::vector<T> toHost() const {
    std::vector<T> out(n_);
    if (n_) EXPECT_EQ(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  size_t n_;
  void* p_ = nullptr;
};

class NcclGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = ncclUnavailableReason();
    if (!why.empty()) GTEST_SKIP() << "no NCCL here: " << why;
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  }

  static std::unique_ptr<Communicator> single() {
    NcclOptions o;
    auto id = makeNcclId();
    EXPECT_TRUE(id.hasValue());
    o.id = *id;
    auto c = createNcclCommunicator(o);
    EXPECT_TRUE(c.hasValue()) << c.status().message();
    return c.hasValue() ? std::move(*c) : nullptr;
  }
};

// Values with exact sums, as the ring's tests use.
float exactValue(size_t i) { return float(int(i * 13 % 11)) * 0.25f; }

TEST_F(NcclGpuTest, WorldSizeOneReducesEveryTypeOnDeviceAndHostBuffersLikeTheCpu) {
  auto comm = single();
  ASSERT_TRUE(comm);
  EXPECT_STREQ(comm->backend(), "nccl");
  for (size_t count : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      std::vector<float> f(count);
      for (size_t i = 0; i < count; ++i) f[i] = exactValue(i);
      // float32: on the device, in place.
      DeviceBuffer<float> d(f);
      ASSERT_TRUE(comm->allReduce(d.get(), count, DType::kFloat32, op).isOk());
      EXPECT_EQ(d.toHost(), f) << count << " " << reduceOpName(op);
      // float32 from host memory (staged through the device).
      std::vector<float> h = f;
      ASSERT_TRUE(comm->allReduce(h.data(), count, DType::kFloat32, op).isOk());
      EXPECT_EQ(h, f);
      // Half types, both places, against the CPU conversions.
      for (DType t : {DType::kBFloat16, DType::kFloat16}) {
        std::vector<uint16_t> half(count);
        for (size_t i = 0; i < count; ++i) half[i] = t == DType::kBFloat16 ? floatToBf16(f[i]) : floatToFp16(f[i]);
        DeviceBuffer<uint16_t> dh(half);
        ASSERT_TRUE(comm->allReduce(dh.get(), count, t, op).isOk());
        EXPECT_EQ(dh.toHost(), half);
        std::vector<uint16_t> hh = half;
        ASSERT_TRUE(comm->allReduce(hh.data(), count, t, op).isOk());
        EXPECT_EQ(hh, half);
      }
    }
  }
  EXPECT_TRUE(comm->barrier().isOk());
  EXPECT_FALSE(comm->allReduce(nullptr, 4, DType::kInt64, ReduceOp::kSum).isOk());
}

TEST_F(NcclGpuTest, WorldSizeOneBroadcastAndGathers) {
  auto comm = single();
  ASSERT_TRUE(comm);
  std::vector<uint8_t> bytes(777);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 31);
  std::vector<uint8_t> b = bytes;
  ASSERT_TRUE(comm->broadcast(b.data(), b.size(), 0).isOk());
  EXPECT_EQ(b, bytes);
  EXPECT_FALSE(comm->broadcast(b.data(), b.size(), 1).isOk());
  std::vector<uint8_t> out(bytes.size());
  ASSERT_TRUE(comm->allGather(bytes.data(), out.data(), bytes.size()).isOk());
  EXPECT_EQ(out, bytes);
  DeviceBuffer<uint8_t> din(bytes), dout(std::vector<uint8_t>(bytes.size()));
  ASSERT_TRUE(comm->allGather(din.get(), dout.get(), bytes.size()).isOk());
  EXPECT_EQ(dout.toHost(), bytes);
  auto v = comm->allGatherV(bytes.data(), 300);
  ASSERT_TRUE(v.hasValue()) << v.status().message();
  ASSERT_EQ(v->size(), 1u);
  ASSERT_EQ((*v)[0].size(), 300u);
  EXPECT_EQ(std::memcmp((*v)[0].data(), bytes.data(), 300), 0);
}

TEST_F(NcclGpuTest, TwoRanksOnTwoDevicesAgreeBitForBit) {
  int devices = 0;
  cudaGetDeviceCount(&devices);
  if (devices < 2) GTEST_SKIP() << "one CUDA device here; NCCL takes one rank per device";
  auto id = makeNcclId();
  ASSERT_TRUE(id.hasValue());
  const size_t count = 3 << 18;
  std::vector<std::vector<float>> results(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      NcclOptions o;
      o.rank = r;
      o.size = 2;
      o.id = *id;
      auto c = createNcclCommunicator(o);
      ASSERT_TRUE(c.hasValue()) << c.status().message();
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = float(i % 1000) * 0.001f * float(r + 1) + 0.1f;
      ASSERT_TRUE((*c)->allReduce(v.data(), count, DType::kFloat32, ReduceOp::kAverage).isOk());
      results[size_t(r)] = std::move(v);
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_EQ(results[0].size(), count);
  EXPECT_EQ(results[0], results[1]);
  for (size_t i = 0; i < count; i += 4099) {
    EXPECT_NEAR(results[0][i], float(i % 1000) * 0.0015f + 0.1f, 1e-5f) << i;
  }
}

TEST_F(NcclGpuTest, AGroupThatNeverFormsFailsByHealthAndByTimeoutInsteadOfHanging) {
  auto id = makeNcclId();
  ASSERT_TRUE(id.hasValue());
  NcclOptions o;
  o.rank = 0;
  o.size = 2;  // rank 1 never comes
  o.id = *id;
  o.connectTimeout = 30s;
  const auto start = std::chrono::steady_clock::now();
  o.health = [start] {
    return std::chrono::steady_clock::now() - start > 300ms ? Status::unavailable("rank 1 is down: killed")
                                                           : Status::ok();
  };
  auto c = createNcclCommunicator(o);
  ASSERT_FALSE(c.hasValue());
  EXPECT_NE(c.status().message().find("rank 1 is down"), std::string::npos) << c.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);

  auto id2 = makeNcclId();
  ASSERT_TRUE(id2.hasValue());
  o.id = *id2;
  o.health = nullptr;
  o.connectTimeout = 500ms;
  const auto start2 = std::chrono::steady_clock::now();
  c = createNcclCommunicator(o);
  ASSERT_FALSE(c.hasValue());
  EXPECT_EQ(c.status().code(), Status::Code::kTimeout) << c.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - start2, 10s);
}

#endif  // TROUPE_HAVE_NCCL

}  // namespace
}  // namespace troupe::collectives
