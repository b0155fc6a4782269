// DLRM dot interaction: against a double-precision reference, its gradient
// against central finite differences, the same bits on 1 and 2 threads, and
// every sum in its documented order (bit for bit against fmaf in that order).
#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "tests/kernels/kernel_test_util.h"

namespace troupe::kernels {
namespace {

using test::expectClose;
using test::makeKernels;
using test::randomFloats;

struct Shape {
  int64_t inputs, batch, dim;
};

class InteractionTest : public ::testing::TestWithParam<Shape> {};

std::vector<const float*> pointers(const std::vector<std::vector<float>>& z) {
  std::vector<const float*> p;
  for (const auto& v : z) p.push_back(v.data());
  return p;
}

TEST_P(InteractionTest, ForwardMatchesReferenceInsideAWiderRow) {
  const auto [n, batch, dim] = GetParam();
  Rng rng(n * 100 + batch * 10 + dim);
  std::vector<std::vector<float>> z(static_cast<size_t>(n));
  for (auto& v : z) v = randomFloats(rng, batch * dim);
  const int64_t pairs = n * (n - 1) / 2, stride = pairs + 3;  // 3 columns before the pairs
  std::vector<double> expect(size_t(batch * stride), 7.0);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t p = 0;
    for (int64_t i = 1; i < n; ++i) {
      for (int64_t j = 0; j < i; ++j, ++p) {
        double acc = 0;
        for (int64_t d = 0; d < dim; ++d) acc += double(z[i][b * dim + d]) * z[j][b * dim + d];
        expect[size_t(b * stride + 3 + p)] = acc;
      }
    }
  }
  for (int threads : {1, 2}) {
    auto k = makeKernels(threads);
    std::vector<float> out(size_t(batch * stride), 7.0f);
    auto ptrs = pointers(z);
    ASSERT_TRUE(k->dotInteractionForward(ptrs.data(), n, batch, dim, out.data() + 3, stride).isOk());
    expectClose(out, expect, 1e-5, 1e-5, "interaction");
  }
}

TEST_P(InteractionTest, BackwardMatchesFiniteDifferences) {
  const auto [n, batch, dim] = GetParam();
  Rng rng(7 + n);
  std::vector<std::vector<float>> z(static_cast<size_t>(n));
  for (auto& v : z) v = randomFloats(rng, batch * dim);
  const int64_t pairs = n * (n - 1) / 2;
  auto dOut = randomFloats(rng, batch * pairs);
  auto k = makeKernels(2);
  std::vector<std::vector<float>> grads(static_cast<size_t>(n), std::vector<float>(size_t(batch * dim), 123.0f));
  std::vector<float*> gptrs;
  for (auto& g : grads) gptrs.push_back(g.data());
  auto ptrs = pointers(z);
  ASSERT_TRUE(k->dotInteractionBackward(ptrs.data(), n, batch, dim, dOut.data(), pairs, gptrs.data()).isOk());
  // loss = sum(dOut * forward(z)); d loss / d z[i][e] by central differences in double.
  auto loss = [&](const std::vector<std::vector<double>>& zd) {
    double total = 0;
    for (int64_t b = 0; b < batch; ++b) {
      int64_t p = 0;
      for (int64_t i = 1; i < n; ++i) {
        for (int64_t j = 0; j < i; ++j, ++p) {
          double acc = 0;
          for (int64_t d = 0; d < dim; ++d) acc += zd[i][b * dim + d] * zd[j][b * dim + d];
          total += dOut[size_t(b * pairs + p)] * acc;
        }
      }
    }
    return total;
  };
  std::vector<std::vector<double>> zd(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) zd[i].assign(z[i].begin(), z[i].end());
  // Every coordinate of small shapes; a strided sample of the large one.
  const int64_t stride = std::max<int64_t>(1, batch * dim * n / 600);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> numeric(size_t(batch * dim));
    std::vector<float> checked(size_t(batch * dim));
    for (int64_t e = 0; e < batch * dim; ++e) {
      checked[size_t(e)] = grads[size_t(i)][size_t(e)];
      if (e % stride != 0) {
        numeric[size_t(e)] = checked[size_t(e)];  // not checked
        continue;
      }
      const double h = 1e-4, keep = zd[i][e];
      zd[i][e] = keep + h;
      const double up = loss(zd);
      zd[i][e] = keep - h;
      const double down = loss(zd);
      zd[i][e] = keep;
      numeric[size_t(e)] = (up - down) / (2 * h);
    }
    expectClose(checked, numeric, 1e-3, 1e-4, "d interaction");
  }
}

TEST_P(InteractionTest, SameBitsOnOneAndTwoThreads) {
  const auto [n, batch, dim] = GetParam();
  Rng rng(99);
  std::vector<std::vector<float>> z(static_cast<size_t>(n));
  for (auto& v : z) v = randomFloats(rng, batch * dim);
  const int64_t pairs = n * (n - 1) / 2;
  auto dOut = randomFloats(rng, batch * pairs);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2}) {
    auto k = makeKernels(threads);
    std::vector<std::vector<float>> grads(static_cast<size_t>(n), std::vector<float>(size_t(batch * dim)));
    std::vector<float*> gptrs;
    for (auto& g : grads) gptrs.push_back(g.data());
    auto ptrs = pointers(z);
    ASSERT_TRUE(k->dotInteractionBackward(ptrs.data(), n, batch, dim, dOut.data(), pairs, gptrs.data()).isOk());
    std::vector<float> flat;
    for (auto& g : grads) flat.insert(flat.end(), g.begin(), g.end());
    results.push_back(flat);
  }
  EXPECT_TRUE(test::bitEqual(results[0], results[1]));
}

// a * b + acc rounded once where the machine fuses (x86 with FMA or AVX-512,
// aarch64: what the kernel documents), twice elsewhere. (This file is built
// with -ffp-contract=off, so the second form is not fused behind our back.)
float fusedOrNot(float a, float b, float acc) {
#if defined(__FMA__) || defined(__AVX512F__) || defined(__aarch64__)
  return std::fmaf(a, b, acc);
#else
  return acc + a * b;
#endif
}

TEST_P(InteractionTest, EverySumRunsInItsDocumentedOrder) {
  // Forward: pair (i, j) is sum over d ascending of z_i[d] z_j[d]; backward:
  // dz_i[d] is sum over j ascending, j != i, of g(i, j) z_j[d]; each from +0.
  // Every path (vectors of any width, the plain loops) must give these bits.
  const auto [n, batch, dim] = GetParam();
  Rng rng(7 + n + dim);
  std::vector<std::vector<float>> z(static_cast<size_t>(n));
  for (auto& v : z) v = randomFloats(rng, batch * dim);
  const int64_t pairs = n * (n - 1) / 2;
  auto dOut = randomFloats(rng, batch * pairs);
  auto k = makeKernels(2);
  auto ptrs = pointers(z);
  std::vector<float> out(size_t(std::max<int64_t>(1, batch * pairs)));
  ASSERT_TRUE(k->dotInteractionForward(ptrs.data(), n, batch, dim, out.data(), pairs).isOk());
  std::vector<std::vector<float>> grads(static_cast<size_t>(n), std::vector<float>(size_t(batch * dim)));
  std::vector<float*> gptrs;
  for (auto& g : grads) gptrs.push_back(g.data());
  ASSERT_TRUE(k->dotInteractionBackward(ptrs.data(), n, batch, dim, dOut.data(), pairs, gptrs.data()).isOk());
  int64_t wrong = 0;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<float> g(size_t(n * n), 0.0f);
    for (int64_t i = 1, p = 0; i < n; ++i) {
      for (int64_t j = 0; j < i; ++j, ++p) {
        float acc = 0.0f;
        for (int64_t d = 0; d < dim; ++d) acc = fusedOrNot(z[i][b * dim + d], z[j][b * dim + d], acc);
        if (!test::bitEqual({acc}, {out[size_t(b * pairs + p)]})) ++wrong;
        g[size_t(i * n + j)] = g[size_t(j * n + i)] = dOut[size_t(b * pairs + p)];
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t d = 0; d < dim; ++d) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          if (j != i) acc = fusedOrNot(g[size_t(i * n + j)], z[j][b * dim + d], acc);
        }
        if (!test::bitEqual({acc}, {grads[i][b * dim + d]})) ++wrong;
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "outputs not in the documented order, of " << batch * (pairs + n * dim);
}

INSTANTIATE_TEST_SUITE_P(Shapes, InteractionTest,
                         ::testing::Values(Shape{2, 1, 1}, Shape{3, 5, 7}, Shape{5, 3, 16}, Shape{1, 4, 3},
                                           Shape{27, 67, 16}, Shape{4, 0, 8},
                                           // The register paths (vectors of 4 floats with SSE or NEON, 8
                                           // with AVX or AVX2, 16 with AVX-512): 1-8 chunks of inputs, 1-8
                                           // vectors of dim and blocks of 8 past that, row groups whole
                                           // and cut short by the last input, and past 8 chunks (the
                                           // plain forward).
                                           Shape{16, 9, 16}, Shape{32, 5, 32}, Shape{33, 4, 48}, Shape{64, 3, 64},
                                           Shape{70, 3, 80}, Shape{8, 6, 8}, Shape{9, 5, 24}, Shape{31, 3, 40},
                                           Shape{25, 3, 56}, Shape{17, 2, 72}, Shape{27, 2, 128},
                                           Shape{24, 3, 136}, Shape{5, 3, 8}, Shape{7, 3, 32}, Shape{9, 2, 96},
                                           Shape{10, 2, 112}, Shape{40, 2, 16}, Shape{57, 2, 8},
                                           Shape{130, 2, 16}, Shape{44, 2, 8}, Shape{52, 2, 8},
                                           Shape{100, 2, 16}, Shape{120, 2, 16}, Shape{9, 2, 144}));

TEST(InteractionTest, RejectsANarrowOutputRow) {
  auto k = makeKernels(1);
  std::vector<float> a(8), b(8), c(8), out(64);
  const float* in[] = {a.data(), b.data(), c.data()};
  Status s = k->dotInteractionForward(in, 3, 2, 4, out.data(), 2);  // 3 pairs need stride >= 3
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace troupe::kernels
