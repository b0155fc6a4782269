// Fused row optimizers against double-precision references of SGD, Adagrad,
// lazy Adam and FTRL-Proximal over several steps, on scattered rows and on one
// dense buffer, for 1 and 2 threads.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include "kernels/row_optimizer.h"
#include "tests/kernels/kernel_test_util.h"

namespace troupe::kernels::test {
namespace {

// One coordinate: weight and state, in double.
struct Coord {
  double w, s0, s1;
};

void referenceStep(const OptimizerConfig& c, Coord& x, double g) {
  switch (c.kind) {
    case OptimizerKind::kSgd:
      x.w -= c.learningRate * (g + c.weightDecay * x.w);
      break;
    case OptimizerKind::kAdagrad:
      x.s0 += g * g;
      x.w -= c.learningRate * g / (std::sqrt(x.s0) + c.eps);
      break;
    case OptimizerKind::kAdam: {
      x.w -= c.learningRate * c.weightDecay * x.w;
      x.s0 = c.beta1 * x.s0 + (1 - c.beta1) * g;
      x.s1 = c.beta2 * x.s1 + (1 - c.beta2) * g * g;
      const double mHat = x.s0 / (1 - std::pow(double(c.beta1), double(c.step)));
      const double vHat = x.s1 / (1 - std::pow(double(c.beta2), double(c.step)));
      // TF LazyAdam / torch SparseAdam put eps outside the bias correction of v.
      const double epsHat = c.eps / std::sqrt(1 - std::pow(double(c.beta2), double(c.step)));
      x.w -= c.learningRate * mHat / (std::sqrt(vHat) + epsHat);
      break;
    }
    case OptimizerKind::kFtrl: {  // McMahan et al. 2013, Algorithm 1
      const double alpha = c.learningRate;
      const double sigma = (std::sqrt(x.s1 + g * g) - std::sqrt(x.s1)) / alpha;
      x.s0 += g - sigma * x.w;
      x.s1 += g * g;
      x.w = std::fabs(x.s0) <= c.l1
                ? 0.0
                : -(x.s0 - std::copysign(double(c.l1), x.s0)) /
                      ((c.ftrlBeta + std::sqrt(x.s1)) / alpha + c.l2);
      break;
    }
  }
}

OptimizerConfig configOf(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  c.learningRate = kind == OptimizerKind::kFtrl ? 0.5f : 0.05f;
  c.weightDecay = kind == OptimizerKind::kSgd || kind == OptimizerKind::kAdam ? 0.01f : 0.0f;
  c.eps = 1e-6f;
  c.initialAccumulator = 0.1f;
  c.l1 = 0.05f;
  c.l2 = 0.1f;
  return c;
}

using Case = std::tuple<OptimizerKind, int64_t, int64_t>;  // kind, rows, dim

class RowOptimizerTest : public ::testing::TestWithParam<Case> {};

TEST_P(RowOptimizerTest, MatchesReferenceOverSteps) {
  const auto [kind, numRows, dim] = GetParam();
  OptimizerConfig config = configOf(kind);
  const int64_t block = optimizerRowFloats(kind, dim);
  const int slots = optimizerStateSlots(kind);
  Rng rng(uint64_t(kind) * 1000 + numRows * 10 + dim);
  // Rows scattered over a larger table in shuffled order, with gaps between.
  const int64_t tableRows = 2 * numRows + 1;
  std::vector<float> init = randomFloats(rng, tableRows * block);
  for (int64_t t = 0; t < tableRows; ++t) initRowState(config, init.data() + t * block, dim);
  std::vector<int64_t> slot(tableRows);
  std::iota(slot.begin(), slot.end(), 0);
  for (int64_t i = tableRows - 1; i > 0; --i) std::swap(slot[i], slot[rng.below(i + 1)]);
  slot.resize(numRows);

  std::vector<Coord> ref(numRows * dim);
  for (int64_t r = 0; r < numRows; ++r) {
    for (int64_t d = 0; d < dim; ++d) {
      const float* row = init.data() + slot[r] * block;
      ref[r * dim + d] = {row[d], slots >= 1 ? row[dim + d] : 0.0, slots >= 2 ? row[2 * dim + d] : 0.0};
    }
  }
  std::vector<float> tables[2] = {init, init};
  const int kSteps = 5;
  for (int step = 1; step <= kSteps; ++step) {
    config.step = step;
    const std::vector<float> grads = randomFloats(rng, numRows * dim, -2.0, 2.0);
    for (int64_t i = 0; i < numRows * dim; ++i) referenceStep(config, ref[i], grads[i]);
    for (int threads : {1, 2}) {
      auto k = makeKernels(threads);
      std::vector<float*> rows(numRows);
      for (int64_t r = 0; r < numRows; ++r) rows[r] = tables[threads - 1].data() + slot[r] * block;
      ASSERT_TRUE(k->applyRowOptimizer(config, rows.data(), numRows, dim, grads.data()).isOk());
    }
  }
  EXPECT_TRUE(bitEqual(tables[0], tables[1])) << "1 and 2 threads differ";
  std::vector<float> got, gotState;
  std::vector<double> want, wantState;
  std::vector<bool> touched(tableRows, false);
  for (int64_t r = 0; r < numRows; ++r) {
    touched[slot[r]] = true;
    const float* row = tables[0].data() + slot[r] * block;
    for (int64_t d = 0; d < dim; ++d) {
      got.push_back(row[d]);
      want.push_back(ref[r * dim + d].w);
      for (int s = 0; s < slots; ++s) {
        gotState.push_back(row[(1 + s) * dim + d]);
        wantState.push_back(s == 0 ? ref[r * dim + d].s0 : ref[r * dim + d].s1);
      }
    }
  }
  expectClose(got, want, 2e-4, 2e-5, "weights");
  expectClose(gotState, wantState, 2e-4, 2e-5, "state");
  for (int64_t t = 0; t < tableRows; ++t) {  // rows not passed stay untouched
    if (touched[t]) continue;
    EXPECT_TRUE(std::equal(init.begin() + t * block, init.begin() + (t + 1) * block,
                           tables[0].begin() + t * block)) << "row " << t << " changed";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, RowOptimizerTest,
    ::testing::Combine(::testing::Values(OptimizerKind::kSgd, OptimizerKind::kAdagrad,
                                         OptimizerKind::kAdam, OptimizerKind::kFtrl),
                       ::testing::Values(int64_t{0}, int64_t{1}, int64_t{5}, int64_t{300}),
                       ::testing::Values(int64_t{1}, int64_t{7}, int64_t{16}, int64_t{33})));

// One dense buffer of P parameters (split over threads by coordinate).
INSTANTIATE_TEST_SUITE_P(
    DenseBuffer, RowOptimizerTest,
    ::testing::Combine(::testing::Values(OptimizerKind::kSgd, OptimizerKind::kAdagrad,
                                         OptimizerKind::kAdam, OptimizerKind::kFtrl),
                       ::testing::Values(int64_t{1}, int64_t{2}),
                       ::testing::Values(int64_t{10007}, int64_t{65536})));

TEST(RowOptimizer, StateSlotsAndInit) {
  EXPECT_EQ(optimizerStateSlots(OptimizerKind::kSgd), 0);
  EXPECT_EQ(optimizerStateSlots(OptimizerKind::kAdagrad), 1);
  EXPECT_EQ(optimizerStateSlots(OptimizerKind::kAdam), 2);
  EXPECT_EQ(optimizerStateSlots(OptimizerKind::kFtrl), 2);
  EXPECT_EQ(optimizerRowFloats(OptimizerKind::kAdam, 16), 48);
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdagrad;
  c.initialAccumulator = 0.25f;
  std::vector<float> row(6, 3.0f);
  initRowState(c, row.data(), 3);
  EXPECT_EQ(row, (std::vector<float>{3, 3, 3, 0.25f, 0.25f, 0.25f}));
}

// With a large l1, FTRL keeps small-gradient weights exactly at zero.
TEST(RowOptimizer, FtrlL1GivesExactZeros) {
  auto k = makeKernels(1);
  OptimizerConfig c = configOf(OptimizerKind::kFtrl);
  c.l1 = 10.0f;
  std::vector<float> row(3 * 4, 0.0f);
  std::vector<float> g = {0.1f, -0.2f, 0.3f, 50.0f};
  float* rows[] = {row.data()};
  ASSERT_TRUE(k->applyRowOptimizer(c, rows, 1, 4, g.data()).isOk());
  EXPECT_EQ(row[0], 0.0f);
  EXPECT_EQ(row[1], 0.0f);
  EXPECT_EQ(row[2], 0.0f);
  EXPECT_LT(row[3], 0.0f);
}

// Adam's first step moves each weight by about lr against the gradient sign.
TEST(RowOptimizer, AdamBiasCorrectionFirstStep) {
  auto k = makeKernels(1);
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  c.learningRate = 0.01f;
  c.step = 1;
  std::vector<float> row(3 * 2, 0.0f);
  std::vector<float> g = {3.0f, -0.001f};
  float* rows[] = {row.data()};
  ASSERT_TRUE(k->applyRowOptimizer(c, rows, 1, 2, g.data()).isOk());
  EXPECT_NEAR(row[0], -0.01f, 1e-6);
  EXPECT_NEAR(row[1], 0.01f, 1e-5);
  c.step = 0;
  EXPECT_EQ(k->applyRowOptimizer(c, rows, 1, 2, g.data()).code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace troupe::kernels::test
