// Dense layer forward/backward against double-precision references, the
// accumulate flag, degenerate shapes, and gradients by finite differences.
#include <tuple>

#include "tests/kernels/kernel_test_util.h"

namespace troupe::kernels::test {
namespace {

struct Layer {
  int64_t batch, in, out;
  std::vector<float> x, w, b, dy;
};

Layer randomLayer(int64_t batch, int64_t in, int64_t out) {
  Rng rng(batch * 7919 + in * 31 + out);
  return {batch, in, out, randomFloats(rng, batch * in), randomFloats(rng, out * in),
          randomFloats(rng, out), randomFloats(rng, batch * out)};
}

std::vector<double> referenceForward(const Layer& l, const std::vector<double>& x,
                                     const std::vector<double>& w, const std::vector<double>& b) {
  std::vector<double> y(l.batch * l.out);
  for (int64_t i = 0; i < l.batch; ++i) {
    for (int64_t j = 0; j < l.out; ++j) {
      double s = b[j];
      for (int64_t k = 0; k < l.in; ++k) s += x[i * l.in + k] * w[j * l.in + k];
      y[i * l.out + j] = s;
    }
  }
  return y;
}

std::vector<double> d(const std::vector<float>& v) { return {v.begin(), v.end()}; }

using Shape = std::tuple<int64_t, int64_t, int64_t, int>;  // batch, in, out, threads

class DenseLayerTest : public ::testing::TestWithParam<Shape> {};

TEST_P(DenseLayerTest, MatchesReference) {
  const auto [batch, in, out, threads] = GetParam();
  const Layer l = randomLayer(batch, in, out);
  auto k = makeKernels(threads);
  std::vector<float> y(batch * out, 5.0f);
  ASSERT_TRUE(k->denseForward(l.x.data(), l.w.data(), l.b.data(), batch, in, out, y.data()).isOk());
  expectClose(y, referenceForward(l, d(l.x), d(l.w), d(l.b)), 1e-4, 1e-4, "y");

  // Reference gradients.
  std::vector<double> dx(batch * in, 0.0), dw(out * in, 0.0), db(out, 0.0);
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t j = 0; j < out; ++j) {
      const double g = l.dy[i * out + j];
      db[j] += g;
      for (int64_t c = 0; c < in; ++c) {
        dx[i * in + c] += g * l.w[j * in + c];
        dw[j * in + c] += g * l.x[i * in + c];
      }
    }
  }
  std::vector<float> gx(batch * in, 9.0f), gw(out * in, 9.0f), gb(out, 9.0f);
  ASSERT_TRUE(k->denseBackward(l.x.data(), l.w.data(), l.dy.data(), batch, in, out, gx.data(),
                               gw.data(), gb.data(), false).isOk());
  expectClose(gx, dx, 1e-4, 1e-4, "dx");
  expectClose(gw, dw, 1e-4, 1e-4, "dw");
  expectClose(gb, db, 1e-4, 1e-4, "db");

  // accumulate: dw and db add to what is there (here: the previous result).
  ASSERT_TRUE(k->denseBackward(l.x.data(), l.w.data(), l.dy.data(), batch, in, out, nullptr,
                               gw.data(), gb.data(), true).isOk());
  for (auto& v : dw) v *= 2;
  for (auto& v : db) v *= 2;
  expectClose(gw, dw, 1e-4, 1e-4, "dw accumulated");
  expectClose(gb, db, 1e-4, 1e-4, "db accumulated");
}

INSTANTIATE_TEST_SUITE_P(Shapes, DenseLayerTest,
                         ::testing::Combine(::testing::Values(int64_t{0}, int64_t{1}, int64_t{17}),
                                            ::testing::Values(int64_t{0}, int64_t{1}, int64_t{33}),
                                            ::testing::Values(int64_t{0}, int64_t{1}, int64_t{9}),
                                            ::testing::Values(1, 2)));
INSTANTIATE_TEST_SUITE_P(Large, DenseLayerTest,
                         ::testing::Values(Shape{64, 784, 256, 2}, Shape{33, 512, 255, 1}));

// dbias is summed over the batch in increasing order whatever the thread
// count (the backward pass hands its blocks to the pool together): the same
// bits as a plain float loop, on 1, 2 and 5 threads, overwritten and added to.
TEST(DenseLayer, BiasGradientIsThePlainSumOnAnyThreadCount) {
  const int64_t batch = 96, in = 200, out = 70;  // big enough for blocks on every thread count here
  const Layer l = randomLayer(batch, in, out);
  std::vector<float> plain(out, 0.0f);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < out; ++j) plain[j] += l.dy[b * out + j];
  }
  std::vector<float> twice = plain;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < out; ++j) twice[j] += l.dy[b * out + j];
  }
  for (int threads : {1, 2, 5}) {
    auto k = makeKernels(threads);
    std::vector<float> gx(batch * in), gw(out * in), gb(out, 7.0f);
    ASSERT_TRUE(k->denseBackward(l.x.data(), l.w.data(), l.dy.data(), batch, in, out, gx.data(), gw.data(),
                                 gb.data(), false).isOk());
    for (int64_t j = 0; j < out; ++j) ASSERT_EQ(gb[j], plain[j]) << "column " << j << ", " << threads << " threads";
    ASSERT_TRUE(k->denseBackward(l.x.data(), l.w.data(), l.dy.data(), batch, in, out, nullptr, gw.data(), gb.data(),
                                 true).isOk());
    for (int64_t j = 0; j < out; ++j) ASSERT_EQ(gb[j], twice[j]) << "column " << j << ", " << threads << " threads";
    // Without dw the bias is summed on its own, the same way.
    std::vector<float> alone(out, 7.0f);
    ASSERT_TRUE(k->denseBackward(l.x.data(), l.w.data(), l.dy.data(), batch, in, out, gx.data(), nullptr,
                                 alone.data(), false).isOk());
    EXPECT_EQ(alone, plain) << threads << " threads";
  }
}

TEST(DenseLayer, NullBiasMeansZero) {
  const Layer l = randomLayer(3, 4, 5);
  auto k = makeKernels(1);
  std::vector<float> y(15);
  ASSERT_TRUE(k->denseForward(l.x.data(), l.w.data(), nullptr, 3, 4, 5, y.data()).isOk());
  expectClose(y, referenceForward(l, d(l.x), d(l.w), std::vector<double>(5, 0.0)), 1e-5, 1e-5, "y");
}

// dL/dx, dL/dw, dL/db for L = sum(y * dy) by central differences of the
// double reference.
TEST(DenseLayer, GradientsMatchFiniteDifferences) {
  const Layer l = randomLayer(4, 6, 3);
  auto k = makeKernels(2);
  std::vector<float> gx(24), gw(18), gb(3);
  ASSERT_TRUE(k->denseBackward(l.x.data(), l.w.data(), l.dy.data(), 4, 6, 3, gx.data(), gw.data(),
                               gb.data(), false).isOk());
  auto loss = [&](const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b) {
    const std::vector<double> y = referenceForward(l, x, w, b);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * l.dy[i];
    return s;
  };
  const double h = 1e-5;
  auto fdOf = [&](int which, size_t n) {
    std::vector<double> fd(n);
    for (size_t i = 0; i < n; ++i) {
      std::vector<double> p[3] = {d(l.x), d(l.w), d(l.b)}, m[3] = {d(l.x), d(l.w), d(l.b)};
      p[which][i] += h;
      m[which][i] -= h;
      fd[i] = (loss(p[0], p[1], p[2]) - loss(m[0], m[1], m[2])) / (2 * h);
    }
    return fd;
  };
  expectClose(gx, fdOf(0, 24), 1e-4, 1e-5, "fd dx");
  expectClose(gw, fdOf(1, 18), 1e-4, 1e-5, "fd dw");
  expectClose(gb, fdOf(2, 3), 1e-4, 1e-5, "fd db");
}

TEST(DenseLayer, RejectsNegativeShape) {
  auto k = makeKernels(1);
  float y = 0;
  EXPECT_EQ(k->denseForward(nullptr, nullptr, nullptr, -1, 1, 1, &y).code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace troupe::kernels::test
