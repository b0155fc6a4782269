// ReLU, sigmoid + binary cross-entropy and softmax cross-entropy against
// double-precision references and central finite differences; stability for
// large logits; bad labels rejected before anything is written.
#include <cmath>
#include <limits>
#include <tuple>

#include "tests/kernels/kernel_test_util.h"

namespace troupe::kernels::test {
namespace {

double referenceBce(const std::vector<double>& z, const std::vector<float>& y) {
  double s = 0;
  for (size_t i = 0; i < z.size(); ++i) {
    // -y log(sigmoid z) - (1 - y) log(1 - sigmoid z), in a form exact for any z.
    const double logP = -std::log1p(std::exp(-std::fabs(z[i]))) + std::fmin(z[i], 0.0);
    const double log1mP = -std::log1p(std::exp(-std::fabs(z[i]))) + std::fmin(-z[i], 0.0);
    s -= y[i] * logP + (1 - y[i]) * log1mP;
  }
  return z.empty() ? 0.0 : s / double(z.size());
}

double referenceSoftmax(const std::vector<double>& z, const std::vector<int32_t>& labels, int64_t classes) {
  const int64_t batch = int64_t(labels.size());
  double s = 0;
  for (int64_t b = 0; b < batch; ++b) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < classes; ++c) m = std::fmax(m, z[b * classes + c]);
    double e = 0;
    for (int64_t c = 0; c < classes; ++c) e += std::exp(z[b * classes + c] - m);
    s += std::log(e) + m - z[b * classes + labels[b]];
  }
  return batch == 0 ? 0.0 : s / double(batch);
}

template <typename Loss>
std::vector<double> finiteDifferences(const std::vector<float>& x, const Loss& loss, double h) {
  std::vector<double> fd(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<double> p(x.begin(), x.end()), m(x.begin(), x.end());
    p[i] += h;
    m[i] -= h;
    fd[i] = (loss(p) - loss(m)) / (2 * h);
  }
  return fd;
}

using Case = std::tuple<int64_t, int>;  // size, threads

class LossTest : public ::testing::TestWithParam<Case> {};

TEST_P(LossTest, SigmoidCrossEntropyMatchesReferenceAndFiniteDifferences) {
  const auto [n, threads] = GetParam();
  Rng rng(n + 17);
  const std::vector<float> z = randomFloats(rng, n, -6, 6);
  std::vector<float> y = randomFloats(rng, n, 0, 1);
  for (int64_t i = 0; i < n; i += 3) y[i] = float(i % 2);
  auto k = makeKernels(threads);
  std::vector<float> dz(n, 42.0f);
  Expected<double> loss = k->sigmoidCrossEntropy(z.data(), y.data(), n, dz.data());
  ASSERT_TRUE(loss.hasValue());
  const std::vector<double> zd(z.begin(), z.end());
  EXPECT_NEAR(*loss, referenceBce(zd, y), 1e-5 * (1 + std::fabs(referenceBce(zd, y))));
  if (n <= 2000) {
    expectClose(dz, finiteDifferences(z, [&](const std::vector<double>& v) { return referenceBce(v, y); }, 1e-4),
                1e-3, 1e-7, "dLogits");
  }
  auto other = makeKernels(3 - threads);
  std::vector<float> dz2(n);
  Expected<double> loss2 = other->sigmoidCrossEntropy(z.data(), y.data(), n, dz2.data());
  EXPECT_EQ(*loss, *loss2) << "loss differs between thread counts";
  EXPECT_TRUE(bitEqual(dz, dz2));
}

TEST_P(LossTest, SoftmaxCrossEntropyMatchesReferenceAndFiniteDifferences) {
  const auto [batch, threads] = GetParam();
  for (int64_t classes : {1, 2, 10, 17}) {
    Rng rng(batch * 100 + classes);
    const std::vector<float> z = randomFloats(rng, batch * classes, -5, 5);
    std::vector<int32_t> labels(batch);
    for (auto& l : labels) l = int32_t(rng.below(classes));
    auto k = makeKernels(threads);
    std::vector<float> dz(batch * classes, 42.0f);
    Expected<double> loss = k->softmaxCrossEntropy(z.data(), labels.data(), batch, classes, dz.data());
    ASSERT_TRUE(loss.hasValue());
    auto ref = [&](const std::vector<double>& v) { return referenceSoftmax(v, labels, classes); };
    const double want = ref({z.begin(), z.end()});
    EXPECT_NEAR(*loss, want, 1e-5 * (1 + want)) << "classes " << classes;
    if (batch * classes <= 3000) expectClose(dz, finiteDifferences(z, ref, 1e-4), 1e-3, 1e-7, "dLogits");
    auto other = makeKernels(3 - threads);
    std::vector<float> dz2(batch * classes);
    EXPECT_EQ(*loss, *other->softmaxCrossEntropy(z.data(), labels.data(), batch, classes, dz2.data()));
    EXPECT_TRUE(bitEqual(dz, dz2));
  }
}

TEST_P(LossTest, ReluMatchesDefinition) {
  const auto [n, threads] = GetParam();
  Rng rng(n);
  std::vector<float> x = randomFloats(rng, n), dy = randomFloats(rng, n);
  if (n > 0) x[0] = 0.0f;  // at 0 the gradient is 0
  auto k = makeKernels(threads);
  std::vector<float> y(n), dx(n);
  k->reluForward(x.data(), n, y.data());
  k->reluBackward(x.data(), dy.data(), n, dx.data());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(y[i], x[i] > 0 ? x[i] : 0.0f) << i;
    ASSERT_EQ(dx[i], x[i] > 0 ? dy[i] : 0.0f) << i;
  }
  // In place, and the gradient against central differences away from 0.
  std::vector<float> inPlace = x;
  k->reluForward(inPlace.data(), n, inPlace.data());
  EXPECT_TRUE(bitEqual(inPlace, y));
  for (int64_t i = 0; i < std::min<int64_t>(n, 100); ++i) {
    if (std::fabs(x[i]) < 1e-3f) continue;
    const double h = 1e-4;
    auto relu = [](double v) { return v > 0 ? v : 0.0; };
    EXPECT_NEAR(dx[i], dy[i] * (relu(x[i] + h) - relu(x[i] - h)) / (2 * h), 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, LossTest,
                         ::testing::Combine(::testing::Values(int64_t{0}, int64_t{1}, int64_t{7},
                                                              int64_t{1023}, int64_t{70001}),
                                            ::testing::Values(1, 2)));

TEST(Losses, StableForLargeLogits) {
  auto k = makeKernels(1);
  const std::vector<float> z = {1e4f, -1e4f, 100.0f, -100.0f, 88.8f, -88.8f};
  const std::vector<float> y = {0, 1, 1, 0, 0, 1};
  std::vector<float> dz(6);
  Expected<double> loss = k->sigmoidCrossEntropy(z.data(), y.data(), 6, dz.data());
  ASSERT_TRUE(loss.hasValue());
  EXPECT_NEAR(*loss, (1e4 + 1e4 + 88.8 + 88.8) / 6, 1e-2);
  const float expect[] = {1, -1, 0, 0, 1, -1};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(dz[i], expect[i] / 6, 1e-6) << i;

  const std::vector<float> logits = {1e4f, -1e4f, 0.0f, 3e4f, 3e4f, 3e4f};
  const std::vector<int32_t> labels = {1, 0};
  std::vector<float> dl(6);
  Expected<double> ce = k->softmaxCrossEntropy(logits.data(), labels.data(), 2, 3, dl.data());
  ASSERT_TRUE(ce.hasValue());
  EXPECT_NEAR(*ce, (2e4 + std::log(3.0)) / 2, 1e-2);
  for (float v : dl) EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(dl[0], 0.5, 1e-6);
  EXPECT_NEAR(dl[1], -0.5, 1e-6);
}

TEST(Losses, BadLabelsAreErrorsAndNothingIsWritten) {
  auto k = makeKernels(2);
  const std::vector<float> logits(6, 0.5f);
  std::vector<float> dl(6, 42.0f);
  for (std::vector<int32_t> labels : {std::vector<int32_t>{0, 3}, std::vector<int32_t>{-1, 0}}) {
    Expected<double> ce = k->softmaxCrossEntropy(logits.data(), labels.data(), 2, 3, dl.data());
    ASSERT_FALSE(ce.hasValue());
    EXPECT_EQ(ce.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(ce.status().message().find("labels["), std::string::npos);
    for (float v : dl) EXPECT_EQ(v, 42.0f);
  }
  const std::vector<float> y = {0.0f, 1.5f};
  Expected<double> bce = k->sigmoidCrossEntropy(logits.data(), y.data(), 2, dl.data());
  ASSERT_FALSE(bce.hasValue());
  EXPECT_NE(bce.status().message().find("labels[1]"), std::string::npos);
  for (float v : dl) EXPECT_EQ(v, 42.0f);
}

}  // namespace
}  // namespace troupe::kernels::test
