// ROC AUC against an O(n^2) pairwise reference with ties; log-loss with
// clipping against a direct formula.
#include <cmath>

#include "kernels/metrics.h"
#include "tests/kernels/kernel_test_util.h"

namespace troupe::kernels::test {
namespace {

double pairwiseAuc(const std::vector<float>& s, const std::vector<float>& y) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (y[i] <= 0.5f) continue;
    for (size_t j = 0; j < s.size(); ++j) {
      if (y[j] > 0.5f) continue;
      pairs += 1;
      wins += s[i] > s[j] ? 1.0 : (s[i] == s[j] ? 0.5 : 0.0);
    }
  }
  return wins / pairs;
}

class AucTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(AucTest, MatchesPairwiseReferenceWithTies) {
  const int64_t n = GetParam();
  for (int levels : {3, 50, 0}) {  // 0: continuous scores (few ties)
    Rng rng(n * 13 + levels);
    std::vector<float> s(n), y(n);
    for (int64_t i = 0; i < n; ++i) {
      y[i] = rng.uniform() < 0.3 ? 1.0f : 0.0f;
      const double u = rng.uniform() + 0.3 * y[i];
      s[i] = levels == 0 ? float(u) : float(std::floor(u * levels) / levels);
    }
    y[0] = 1.0f;
    y[1] = 0.0f;
    EXPECT_NEAR(rocAuc(s.data(), y.data(), n), pairwiseAuc(s, y), 1e-12) << "levels " << levels;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, AucTest, ::testing::Values(2, 3, 10, 257, 2000));

TEST(Auc, KnownValuesAndUndefinedCases) {
  const std::vector<float> s = {0.1f, 0.2f, 0.3f, 0.4f};
  EXPECT_DOUBLE_EQ(rocAuc(s.data(), std::vector<float>{0, 0, 1, 1}.data(), 4), 1.0);
  EXPECT_DOUBLE_EQ(rocAuc(s.data(), std::vector<float>{1, 1, 0, 0}.data(), 4), 0.0);
  EXPECT_DOUBLE_EQ(rocAuc(std::vector<float>(4, 0.5f).data(), std::vector<float>{1, 0, 1, 0}.data(), 4), 0.5);
  EXPECT_TRUE(std::isnan(rocAuc(s.data(), std::vector<float>{1, 1, 1, 1}.data(), 4)));
  EXPECT_TRUE(std::isnan(rocAuc(s.data(), std::vector<float>{0, 0, 0, 0}.data(), 4)));
  EXPECT_TRUE(std::isnan(rocAuc(nullptr, nullptr, 0)));
}

TEST(LogLoss, MatchesFormulaAndClips) {
  Rng rng(5);
  const int64_t n = 1001;
  std::vector<float> p = randomFloats(rng, n, 0, 1), y = randomFloats(rng, n, 0, 1);
  p[0] = 0.0f;  // clipped to eps
  y[0] = 1.0f;
  p[1] = 1.0f;  // clipped to 1 - eps
  y[1] = 0.0f;
  double want = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double q = std::fmin(std::fmax(double(p[i]), 1e-7), 1 - 1e-7);
    want -= y[i] * std::log(q) + (1 - y[i]) * std::log(1 - q);
  }
  want /= double(n);
  const double got = logLoss(p.data(), y.data(), n);
  EXPECT_NEAR(got, want, 1e-9 * want);
  EXPECT_TRUE(std::isfinite(got));
  EXPECT_NEAR(logLoss(p.data(), y.data(), 1), -std::log(1e-7), 1e-6);
  EXPECT_TRUE(std::isnan(logLoss(nullptr, nullptr, 0)));
}

}  // namespace
}  // namespace troupe::kernels::test
