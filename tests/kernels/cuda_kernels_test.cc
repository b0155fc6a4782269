// The CUDA kernels against the CPU kernels on the same inputs. Built only with
// CUDA; on a machine without a CUDA device every test skips, saying so.
#include <cmath>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "common/hash.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"

namespace troupe::kernels {
namespace {

template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), (n_ + 1) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceVector() { cudaFree(p_); }
  T* get() { return p_; }
  std::vector<T> toHost() const {
    std::vector<T> out(n_);
    EXPECT_EQ(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  size_t n_;
  T* p_ = nullptr;
};

std::vector<float> randomFloats(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(rng.normal());
  return v;
}

void expectNear(const std::vector<float>& a, const std::vector<float>& b, float tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], tol * (1.0f + std::fabs(a[i]))) << "at " << i;
  }
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::cudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    gpu_ = createKernels({Device::kCuda, 1});
    cpu_ = createKernels({Device::kCpu, 2});
  }
  std::unique_ptr<Kernels> gpu_, cpu_;
};

TEST_F(CudaKernelsTest, EmbeddingBagForwardAndBackwardMatchCpu) {
  const int64_t numRows = 97, dim = 37, batch = 33;
  Rng rng(3);
  std::vector<int64_t> offsets{0};
  std::vector<int64_t> indices;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = int64_t(rng.below(6));  // includes empty bags
    for (int64_t i = 0; i < len; ++i) indices.push_back(int64_t(rng.below(numRows)));
    offsets.push_back(int64_t(indices.size()));
  }
  auto rows = randomFloats(numRows * dim, 1);
  auto weights = randomFloats(indices.size(), 2);
  auto gradOut = randomFloats(batch * dim, 4);
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
    for (bool weighted : {false, true}) {
      DeviceVector<float> dRows(rows), dWeights(weights), dGradOut(gradOut);
      DeviceVector<int64_t> dIdx(indices), dOff(offsets);
      DeviceVector<float> dOut{std::vector<float>(batch * dim)};
      DeviceVector<float> dGradRows{std::vector<float>(numRows * dim, 0.5f)};
      EmbeddingBags host{BagIndices::of(indices.data(), int64_t(indices.size())), offsets.data(), batch,
                         weighted ? weights.data() : nullptr, pooling};
      EmbeddingBags dev{BagIndices::of(dIdx.get(), int64_t(indices.size())), dOff.get(), batch,
                        weighted ? dWeights.get() : nullptr, pooling};
      std::vector<float> out(batch * dim), gradRows(numRows * dim, 0.5f);
      ASSERT_TRUE(cpu_->embeddingBagForward(rows.data(), numRows, dim, host, out.data()).isOk());
      ASSERT_TRUE(gpu_->embeddingBagForward(dRows.get(), numRows, dim, dev, dOut.get()).isOk());
      expectNear(out, dOut.toHost(), 1e-5f);
      ASSERT_TRUE(cpu_->embeddingBagBackward(gradOut.data(), dim, host, gradRows.data(), numRows).isOk());
      ASSERT_TRUE(gpu_->embeddingBagBackward(dGradOut.get(), dim, dev, dGradRows.get(), numRows).isOk());
      expectNear(gradRows, dGradRows.toHost(), 1e-5f);
    }
  }
  // A bad index is refused before anything is read.
  std::vector<int64_t> bad = indices;
  bad[bad.size() / 2] = numRows;
  DeviceVector<int64_t> dBad(bad), dOff(offsets);
  DeviceVector<float> dRows(rows), dOut{std::vector<float>(batch * dim)};
  EmbeddingBags dev{BagIndices::of(dBad.get(), int64_t(bad.size())), dOff.get(), batch, nullptr, Pooling::kSum};
  Status s = gpu_->embeddingBagForward(dRows.get(), numRows, dim, dev, dOut.get());
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.toString();
}

TEST_F(CudaKernelsTest, DedupMatchesCpuInFirstSeenOrder) {
  const int64_t n = 1000, dim = 8;
  Rng rng(5);
  std::vector<uint64_t> keys(n);
  for (auto& k : keys) k = mix64(rng.below(77));
  auto grads = randomFloats(n * dim, 6);
  std::vector<uint64_t> uniq(n);
  std::vector<float> summed(n * dim);
  std::vector<int64_t> inverse(n);
  auto count = cpu_->dedupGradients(keys.data(), grads.data(), n, dim, uniq.data(), summed.data(), inverse.data());
  ASSERT_TRUE(count.hasValue());
  DeviceVector<uint64_t> dKeys(keys), dUniq{std::vector<uint64_t>(n)};
  DeviceVector<float> dGrads(grads), dSummed{std::vector<float>(n * dim)};
  DeviceVector<int64_t> dInverse{std::vector<int64_t>(n)};
  auto gCount = gpu_->dedupGradients(dKeys.get(), dGrads.get(), n, dim, dUniq.get(), dSummed.get(), dInverse.get());
  ASSERT_TRUE(gCount.hasValue()) << gCount.status().toString();
  ASSERT_EQ(*count, *gCount);
  auto gUniq = dUniq.toHost();
  auto gInverse = dInverse.toHost();
  auto gSummed = dSummed.toHost();
  for (int64_t u = 0; u < *count; ++u) ASSERT_EQ(uniq[u], gUniq[u]) << u;
  EXPECT_EQ(inverse, gInverse);
  summed.resize(*count * dim);
  gSummed.resize(*count * dim);
  expectNear(summed, gSummed, 1e-5f);
}

TEST_F(CudaKernelsTest, OptimizersMatchCpu) {
  const int64_t numRows = 19, dim = 21;
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kAdam,
                             OptimizerKind::kFtrl}) {
    OptimizerConfig c;
    c.kind = kind;
    c.learningRate = 0.05f;
    c.l1 = 0.01f;
    const int64_t rowFloats = optimizerRowFloats(kind, dim);
    auto block = randomFloats(numRows * rowFloats, 7);
    for (int64_t r = 0; r < numRows; ++r) initRowState(c, block.data() + r * rowFloats, dim);
    DeviceVector<float> dBlock(block);
    std::vector<float*> rows(numRows), dRows(numRows);
    for (int64_t r = 0; r < numRows; ++r) {
      rows[r] = block.data() + r * rowFloats;
      dRows[r] = dBlock.get() + r * rowFloats;
    }
    DeviceVector<float*> dRowPtrs(dRows);
    for (int64_t step = 1; step <= 3; ++step) {
      c.step = step;
      auto grads = randomFloats(numRows * dim, 100 + step);
      DeviceVector<float> dGrads(grads);
      ASSERT_TRUE(cpu_->applyRowOptimizer(c, rows.data(), numRows, dim, grads.data()).isOk());
      ASSERT_TRUE(gpu_->applyRowOptimizer(c, dRowPtrs.get(), numRows, dim, dGrads.get()).isOk());
    }
    expectNear(block, dBlock.toHost(), 1e-4f);
  }
}

TEST_F(CudaKernelsTest, DenseReluAndLossesMatchCpu) {
  const int64_t batch = 17, in = 33, out = 9;
  auto x = randomFloats(batch * in, 8), w = randomFloats(out * in, 9), b = randomFloats(out, 10);
  auto dy = randomFloats(batch * out, 11);
  DeviceVector<float> dX(x), dW(w), dB(b), dDy(dy);
  DeviceVector<float> dY{std::vector<float>(batch * out)}, dDx{std::vector<float>(batch * in)};
  DeviceVector<float> dDw{std::vector<float>(out * in)}, dDb{std::vector<float>(out)};
  std::vector<float> y(batch * out), dx(batch * in), dw(out * in), db(out);
  ASSERT_TRUE(cpu_->denseForward(x.data(), w.data(), b.data(), batch, in, out, y.data()).isOk());
  ASSERT_TRUE(gpu_->denseForward(dX.get(), dW.get(), dB.get(), batch, in, out, dY.get()).isOk());
  expectNear(y, dY.toHost(), 1e-4f);
  ASSERT_TRUE(cpu_->denseBackward(x.data(), w.data(), dy.data(), batch, in, out, dx.data(), dw.data(), db.data(),
                                  false).isOk());
  ASSERT_TRUE(gpu_->denseBackward(dX.get(), dW.get(), dDy.get(), batch, in, out, dDx.get(), dDw.get(), dDb.get(),
                                  false).isOk());
  expectNear(dx, dDx.toHost(), 1e-4f);
  expectNear(dw, dDw.toHost(), 1e-4f);
  expectNear(db, dDb.toHost(), 1e-4f);

  std::vector<float> r(x.size());
  cpu_->reluForward(x.data(), int64_t(x.size()), r.data());
  DeviceVector<float> dR{std::vector<float>(x.size())};
  gpu_->reluForward(dX.get(), int64_t(x.size()), dR.get());
  expectNear(r, dR.toHost(), 0.0f);

  std::vector<float> labels(batch * out);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = float(i % 3 == 0);
  DeviceVector<float> dLabels(labels), dGrad{std::vector<float>(labels.size())};
  std::vector<float> grad(labels.size());
  auto cpuLoss = cpu_->sigmoidCrossEntropy(y.data(), labels.data(), int64_t(labels.size()), grad.data());
  auto gpuLoss = gpu_->sigmoidCrossEntropy(dY.get(), dLabels.get(), int64_t(labels.size()), dGrad.get());
  ASSERT_TRUE(cpuLoss.hasValue() && gpuLoss.hasValue());
  EXPECT_NEAR(*cpuLoss, *gpuLoss, 1e-5);
  expectNear(grad, dGrad.toHost(), 1e-5f);

  std::vector<int32_t> classes(batch);
  for (int64_t i = 0; i < batch; ++i) classes[i] = int32_t(i % out);
  DeviceVector<int32_t> dClasses(classes);
  auto cpuCe = cpu_->softmaxCrossEntropy(y.data(), classes.data(), batch, out, grad.data());
  auto gpuCe = gpu_->softmaxCrossEntropy(dY.get(), dClasses.get(), batch, out, dGrad.get());
  ASSERT_TRUE(cpuCe.hasValue() && gpuCe.hasValue());
  EXPECT_NEAR(*cpuCe, *gpuCe, 1e-5);
  classes[3] = int32_t(out);
  DeviceVector<int32_t> dBadClasses(classes);
  EXPECT_FALSE(gpu_->softmaxCrossEntropy(dY.get(), dBadClasses.get(), batch, out, nullptr).hasValue());
}

}  // namespace
}  // namespace troupe::kernels
