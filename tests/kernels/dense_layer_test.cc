// Dense layer forward/backward against double-precision references, the
// accumulate flag, degenerate shapes, and gradients by finite differences.
#include <tuple>

#include "kernels/cpu/dense_layer.h"
#include "tests/kernels/kernel_test_util.h"

namespace troupe::kernels::test {
namespace {

using cpu::DenseTiles;
using cpu::denseTiles;

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
// Many threads: products cut into tiles of rows by columns, with column cuts
// on cache lines and widths that are not multiples of 16 (the DLRM's top
// layers among them; more threads than cores is fine for correctness).
INSTANTIATE_TEST_SUITE_P(Tiled, DenseLayerTest,
                         ::testing::Values(Shape{256, 783, 128, 16}, Shape{256, 128, 64, 16}, Shape{256, 130, 64, 16},
                                           Shape{100, 700, 50, 4}, Shape{37, 300, 200, 8}, Shape{300, 410, 33, 7},
                                           Shape{64, 1000, 17, 16}));

// The cut of a product over threads, against the cost model worked by hand:
// the most tiles (one a thread at most, each at least 16 x 16 and 2^19
// flops); blocks of whole rows where they are 64 rows or more; else the
// least packing, k (m cols + n rows).
TEST(DenseLayer, TilesAreTheMostThenTheLeastPacking) {
  auto is = [](DenseTiles t, int64_t rows, int64_t cols) { return t.rows == rows && t.cols == cols; };
  // One thread, or too little work: one tile.
  EXPECT_TRUE(is(denseTiles(1, 256, 128, 783), 1, 1));
  EXPECT_TRUE(is(denseTiles(16, 256, 16, 64), 1, 1));  // 2^19 flops: one tile's worth
  EXPECT_TRUE(is(denseTiles(16, 256, 64, 1), 1, 1));   // the DLRM's last layer, 32K flops
  EXPECT_TRUE(is(denseTiles(16, 0, 64, 64), 1, 1));
  // The DLRM's first top layer (batch 256, 783 in, 128 out) on 16 threads:
  // forward 256 x 128 (k 783): (16,1) packs 256 + 16 * 128 = 2304, (8,2)
  // and (4,4) 1536, (2,8) 2304; the first of the least is kept.
  EXPECT_TRUE(is(denseTiles(16, 256, 128, 783), 4, 4));
  // dx 256 x 783 (k 128): (1,16) 4096 + 783 = 4879, (2,8) 2048 + 1566 = 3614,
  // (4,4) 1024 + 3132 = 4156, (8,2) 512 + 6264, (16,1) 256 + 12528.
  EXPECT_TRUE(is(denseTiles(16, 256, 783, 128), 2, 8));
  // dw 128 x 783 (k 256): (1,16) 2048 + 783 = 2831, (2,8) 1024 + 1566 = 2590,
  // (4,4) 512 + 3132, (8,2) 256 + 6264.
  EXPECT_TRUE(is(denseTiles(16, 128, 783, 256), 2, 8));
  // Two threads: blocks of 128 and 64 whole rows, though (1,2) would pack
  // less for dw (256 + 783 = 1039 against 128 + 1566 = 1694) and for dx.
  EXPECT_TRUE(is(denseTiles(2, 256, 128, 783), 2, 1));
  EXPECT_TRUE(is(denseTiles(2, 128, 783, 256), 2, 1));
  EXPECT_TRUE(is(denseTiles(2, 256, 783, 128), 2, 1));
  // Four threads: the forward's 256 rows in 4 blocks of 64; dw's 128 rows
  // would be blocks of 32, so the least packing: (1,4) 512 + 783 = 1295,
  // (2,2) 256 + 1566 = 1822, (4,1) 128 + 3132 = 3260.
  EXPECT_TRUE(is(denseTiles(4, 256, 128, 783), 4, 1));
  EXPECT_TRUE(is(denseTiles(4, 128, 783, 256), 1, 4));
  // Eight threads, forward: 32-row blocks are too thin; (4,2) packs
  // 512 + 512 = 1024, (2,4) 1024 + 256 = 1280, (8,1) 256 + 1024 = 1280.
  EXPECT_TRUE(is(denseTiles(8, 256, 128, 783), 4, 2));
  // Work for 4 tiles of 2^19 flops (2 * 128 * 64 * 128 = 2^21) on 16 threads.
  EXPECT_EQ(denseTiles(16, 128, 64, 128).count(), 4);
  // Narrow: 17 columns are 2 cache lines but one 16-wide tile at most; 40 rows are 2 row blocks.
  EXPECT_TRUE(is(denseTiles(16, 40, 17, 100000), 2, 1));
  // Never more tiles than threads, never a side under 16 (unless the whole is).
  for (int threads : {2, 3, 5, 8, 16, 64}) {
    for (int64_t m : {1, 15, 16, 33, 256, 1000}) {
      for (int64_t n : {1, 16, 31, 128, 783}) {
        const DenseTiles t = denseTiles(threads, m, n, 4096);
        EXPECT_LE(t.count(), threads);
        EXPECT_GE(t.count(), 1);
        EXPECT_LE(t.rows, std::max<int64_t>(1, m / 16)) << threads << " " << m << " " << n;
        EXPECT_LE(t.cols, std::max<int64_t>(1, n / 16)) << threads << " " << m << " " << n;
      }
    }
  }
}

// dbias is summed over the batch in increasing order whatever the thread
// count (the backward pass hands its blocks to the pool together): the same
// bits as a plain float loop, on 1, 2, 5 and 16 threads, overwritten and added to.
TEST(DenseLayer, BiasGradientIsThePlainSumOnAnyThreadCount) {
  // 96 x 200 x 70: dw in one row block of 2-5 column blocks; 256 x 783 x
  // 128 (the DLRM's first top layer): dw in 2 row blocks of 8 on 16 threads.
  for (auto [batch, in, out] : {std::tuple<int64_t, int64_t, int64_t>{96, 200, 70}, {256, 783, 128}}) {
    const Layer l = randomLayer(batch, in, out);
    std::vector<float> plain(out, 0.0f);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t j = 0; j < out; ++j) plain[j] += l.dy[b * out + j];
    }
    std::vector<float> twice = plain;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t j = 0; j < out; ++j) twice[j] += l.dy[b * out + j];
    }
    for (int threads : {1, 2, 5, 16}) {
      SCOPED_TRACE(::testing::Message() << batch << " x " << in << " x " << out << ", " << threads << " threads");
      auto k = makeKernels(threads);
      std::vector<float> gx(batch * in), gw(out * in), gb(out, 7.0f);
      ASSERT_TRUE(k->denseBackward(l.x.data(), l.w.data(), l.dy.data(), batch, in, out, gx.data(), gw.data(),
                                   gb.data(), false).isOk());
      for (int64_t j = 0; j < out; ++j) ASSERT_EQ(gb[j], plain[j]) << "column " << j;
      ASSERT_TRUE(k->denseBackward(l.x.data(), l.w.data(), l.dy.data(), batch, in, out, nullptr, gw.data(),
                                   gb.data(), true).isOk());
      for (int64_t j = 0; j < out; ++j) ASSERT_EQ(gb[j], twice[j]) << "column " << j;
      // Without dw the bias is summed on its own, the same way.
      std::vector<float> alone(out, 7.0f);
      ASSERT_TRUE(k->denseBackward(l.x.data(), l.w.data(), l.dy.data(), batch, in, out, gx.data(), nullptr,
                                   alone.data(), false).isOk());
      EXPECT_EQ(alone, plain);
    }
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
