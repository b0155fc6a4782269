// Embedding-bag forward/backward against a double-precision reference, with
// variable and empty bags, weights, both poolings and index widths, heavy
// duplicate indices, finite-difference gradients and bad-input errors.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "kernels/embedding_bag.h"
#include "tests/kernels/kernel_test_util.h"

namespace troupe::kernels::test {
namespace {

struct Batch {
  std::vector<int64_t> indices;
  std::vector<int32_t> indices32;
  std::vector<int64_t> offsets;
  std::vector<float> weights;
};

// Random bags of length 0..maxLen (every 5th bag empty) over numRows rows.
Batch randomBatch(Rng& rng, int64_t batch, int64_t numRows, int64_t maxLen) {
  Batch b;
  b.offsets.push_back(0);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t len = (i % 5 == 4 || numRows == 0) ? 0 : int64_t(rng.below(maxLen + 1));
    for (int64_t k = 0; k < len; ++k) b.indices.push_back(int64_t(rng.below(numRows)));
    b.offsets.push_back(int64_t(b.indices.size()));
  }
  b.indices32.assign(b.indices.begin(), b.indices.end());
  for (size_t i = 0; i < b.indices.size(); ++i) b.weights.push_back(float(0.5 + rng.uniform()));
  return b;
}

EmbeddingBags bagsOf(const Batch& b, bool use32, bool weighted, Pooling pooling) {
  EmbeddingBags bags;
  const int64_t nnz = int64_t(b.indices.size());
  bags.indices = use32 ? BagIndices::of(b.indices32.data(), nnz) : BagIndices::of(b.indices.data(), nnz);
  bags.offsets = b.offsets.data();
  bags.batch = int64_t(b.offsets.size()) - 1;
  bags.weights = weighted ? b.weights.data() : nullptr;
  bags.pooling = pooling;
  return bags;
}

double scaleOf(const Batch& b, int64_t bag, int64_t p, bool weighted, Pooling pooling) {
  const double w = weighted ? b.weights[p] : 1.0;
  const int64_t len = b.offsets[bag + 1] - b.offsets[bag];
  return pooling == Pooling::kMean ? w / double(len) : w;
}

std::vector<double> referenceForward(const std::vector<double>& rows, int64_t dim, const Batch& b,
                                     bool weighted, Pooling pooling) {
  const int64_t batch = int64_t(b.offsets.size()) - 1;
  std::vector<double> out(batch * dim, 0.0);
  for (int64_t bag = 0; bag < batch; ++bag) {
    for (int64_t p = b.offsets[bag]; p < b.offsets[bag + 1]; ++p) {
      const double s = scaleOf(b, bag, p, weighted, pooling);
      for (int64_t d = 0; d < dim; ++d) out[bag * dim + d] += s * rows[b.indices[p] * dim + d];
    }
  }
  return out;
}

std::vector<double> referenceBackward(const std::vector<float>& gradOut, int64_t dim, const Batch& b,
                                      bool weighted, Pooling pooling, std::vector<double> gradRows) {
  const int64_t batch = int64_t(b.offsets.size()) - 1;
  for (int64_t bag = 0; bag < batch; ++bag) {
    for (int64_t p = b.offsets[bag]; p < b.offsets[bag + 1]; ++p) {
      const double s = scaleOf(b, bag, p, weighted, pooling);
      for (int64_t d = 0; d < dim; ++d) gradRows[b.indices[p] * dim + d] += s * gradOut[bag * dim + d];
    }
  }
  return gradRows;
}

std::vector<double> toDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::vector<float> absOf(std::vector<float> v) {
  for (auto& x : v) x = std::fabs(x);
  return v;
}

// (dim, batch, numRows): numRows small gives heavy duplicates; large uses the
// sort path of the backward pass.
using Shape = std::tuple<int64_t, int64_t, int64_t>;

class EmbeddingBagTest : public ::testing::TestWithParam<Shape> {};

TEST_P(EmbeddingBagTest, MatchesReferenceAndIsThreadIndependent) {
  const auto [dim, batch, numRows] = GetParam();
  Rng rng(dim * 1000003 + batch * 101 + numRows);
  const Batch b = randomBatch(rng, batch, numRows, 40);
  const std::vector<float> rows = randomFloats(rng, numRows * dim);
  const std::vector<float> gradOut = randomFloats(rng, batch * dim);
  const std::vector<float> gradInit = randomFloats(rng, numRows * dim);
  auto one = makeKernels(1);
  auto two = makeKernels(2);
  for (bool use32 : {false, true}) {
    for (bool weighted : {false, true}) {
      for (Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
        SCOPED_TRACE(::testing::Message() << "int32 " << use32 << " weighted " << weighted << " mean "
                                          << (pooling == Pooling::kMean));
        const EmbeddingBags bags = bagsOf(b, use32, weighted, pooling);
        std::vector<float> out1(batch * dim, 7.0f), out2(batch * dim, -7.0f);
        ASSERT_TRUE(one->embeddingBagForward(rows.data(), numRows, dim, bags, out1.data()).isOk());
        ASSERT_TRUE(two->embeddingBagForward(rows.data(), numRows, dim, bags, out2.data()).isOk());
        expectClose(out1, referenceForward(toDouble(rows), dim, b, weighted, pooling), 1e-5, 1e-5, "out");
        EXPECT_TRUE(bitEqual(out1, out2)) << "forward differs between 1 and 2 threads";

        std::vector<float> grad1 = gradInit, grad2 = gradInit;
        ASSERT_TRUE(one->embeddingBagBackward(gradOut.data(), dim, bags, grad1.data(), numRows).isOk());
        ASSERT_TRUE(two->embeddingBagBackward(gradOut.data(), dim, bags, grad2.data(), numRows).isOk());
        // Float sums of thousands of duplicates: tolerance from the sum of |terms|.
        const std::vector<double> want =
            referenceBackward(gradOut, dim, b, weighted, pooling, toDouble(gradInit));
        const std::vector<double> absSum =
            referenceBackward(absOf(gradOut), dim, b, weighted, pooling, toDouble(absOf(gradInit)));
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_NEAR(grad1[i], want[i], 1e-5 * absSum[i] + 1e-6) << "gradRows[" << i << "]";
        }
        EXPECT_TRUE(bitEqual(grad1, grad2)) << "backward differs between 1 and 2 threads";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmbeddingBagTest,
                         ::testing::Values(Shape{16, 0, 10}, Shape{0, 5, 10}, Shape{1, 1, 1},
                                           Shape{7, 37, 3}, Shape{16, 300, 2}, Shape{17, 200, 50},
                                           Shape{64, 129, 1000}, Shape{100, 40, 20},
                                           Shape{16, 64, 100000}, Shape{33, 3, 0}));

// d(sum(out * R))/d rows by central differences of the double reference
// forward equals the backward pass with gradOut = R.
TEST(EmbeddingBagGradient, MatchesFiniteDifferences) {
  Rng rng(7);
  const int64_t dim = 5, numRows = 6, batch = 9;
  const Batch b = randomBatch(rng, batch, numRows, 6);
  const std::vector<float> rows = randomFloats(rng, numRows * dim);
  const std::vector<float> r = randomFloats(rng, batch * dim);
  auto k = makeKernels(2);
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
    const EmbeddingBags bags = bagsOf(b, false, true, pooling);
    std::vector<float> grad(numRows * dim, 0.0f);
    ASSERT_TRUE(k->embeddingBagBackward(r.data(), dim, bags, grad.data(), numRows).isOk());
    auto loss = [&](const std::vector<double>& x) {
      const std::vector<double> out = referenceForward(x, dim, b, true, pooling);
      double s = 0;
      for (size_t i = 0; i < out.size(); ++i) s += out[i] * r[i];
      return s;
    };
    std::vector<double> fd(numRows * dim);
    const double h = 1e-4;
    for (int64_t i = 0; i < numRows * dim; ++i) {
      std::vector<double> plus = toDouble(rows), minus = toDouble(rows);
      plus[i] += h;
      minus[i] -= h;
      fd[i] = (loss(plus) - loss(minus)) / (2 * h);
    }
    expectClose(grad, fd, 1e-4, 1e-5, "fd gradRows");
  }
}

TEST(EmbeddingBagValidation, RejectsBadIndicesAndOffsets) {
  auto k = makeKernels(2);
  const int64_t dim = 4, numRows = 10;
  std::vector<float> rows(numRows * dim, 1.0f), out(3 * dim), grad(numRows * dim);
  std::vector<int64_t> indices = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> offsets = {0, 2, 4, 6};
  EmbeddingBags bags;
  bags.indices = BagIndices::of(indices.data(), 6);
  bags.offsets = offsets.data();
  bags.batch = 3;
  ASSERT_TRUE(k->embeddingBagForward(rows.data(), numRows, dim, bags, out.data()).isOk());

  for (int64_t bad : {int64_t{10}, int64_t{-1}, int64_t{1} << 40}) {
    indices[3] = bad;
    Status s = k->embeddingBagForward(rows.data(), numRows, dim, bags, out.data());
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(s.message().find("indices[3]"), std::string::npos) << s.message();
    s = k->embeddingBagBackward(out.data(), dim, bags, grad.data(), numRows);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  }
  indices[3] = 4;
  std::vector<int32_t> indices32 = {1, 2, 3, 4, 5, 77};
  bags.indices = BagIndices::of(indices32.data(), 6);
  Status s32 = k->embeddingBagForward(rows.data(), numRows, dim, bags, out.data());
  EXPECT_NE(s32.message().find("indices[5] = 77"), std::string::npos) << s32.message();
  bags.indices = BagIndices::of(indices.data(), 6);

  offsets = {0, 4, 2, 6};  // not monotonic
  Status s = k->embeddingBagForward(rows.data(), numRows, dim, bags, out.data());
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("offsets[2]"), std::string::npos) << s.message();
  offsets = {0, 2, 4, 7};  // past nnz
  EXPECT_EQ(k->embeddingBagForward(rows.data(), numRows, dim, bags, out.data()).code(),
            Status::Code::kInvalidArgument);
  offsets = {-1, 2, 4, 6};
  EXPECT_EQ(k->embeddingBagBackward(out.data(), dim, bags, grad.data(), numRows).code(),
            Status::Code::kInvalidArgument);
}

// A bad index in a later chunk of a large batch is still found, and it is the
// first bad position that is named.
TEST(EmbeddingBagValidation, NamesFirstBadPositionInLargeBatch) {
  auto k = makeKernels(2);
  const int64_t numRows = 100, nnz = 200000, batch = nnz / 20;
  std::vector<int64_t> indices(nnz, 1), offsets(batch + 1);
  for (int64_t b = 0; b <= batch; ++b) offsets[b] = b * 20;
  indices[150001] = 100;
  indices[190000] = -5;
  std::vector<float> rows(numRows * 2, 0.0f), out(batch * 2);
  EmbeddingBags bags;
  bags.indices = BagIndices::of(indices.data(), nnz);
  bags.offsets = offsets.data();
  bags.batch = batch;
  Status s = k->embeddingBagForward(rows.data(), numRows, 2, bags, out.data());
  EXPECT_NE(s.message().find("indices[150001] = 100"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace troupe::kernels::test
