// The dense models' gradients against finite differences, and determinism.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "common/hash.h"
#include "kernels/kernels.h"
#include "workers/dense_parameters.h"
#include "workers/dlrm_model.h"
#include "workers/mlp.h"

namespace troupe::workers {
namespace {

std::vector<float> randomVector(Rng& rng, int64_t n, double scale = 1.0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = float(rng.normal() * scale);
  return v;
}

kernels::OptimizerConfig sgd() {
  kernels::OptimizerConfig c;
  c.kind = kernels::OptimizerKind::kSgd;
  c.learningRate = 0.1f;
  return c;
}

// Central difference of f at *x, in double around a float coordinate.
template <typename Fn>
double numericGrad(float* x, Fn f, float h) {
  const float keep = *x;
  *x = keep + h;
  const double up = f();
  *x = keep - h;
  const double down = f();
  *x = keep;
  return (up - down) / (double(2 * h));
}

void expectGradClose(double analytic, double numeric, const char* what, int64_t index) {
  EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << what << " " << index;
}

TEST(MlpTest, GradientsMatchFiniteDifferences) {
  auto k = kernels::createKernels({kernels::Device::kCpu, 2});
  const std::vector<int64_t> widths{7, 9, 5, 3};
  DenseParameters params(Mlp::parameterCount(widths), sgd());
  Mlp mlp(widths, false, &params, 0);
  mlp.initialize(3);
  Rng rng(1);
  const int64_t batch = 4;
  auto x = randomVector(rng, batch * 7);
  auto r = randomVector(rng, batch * 3);
  auto loss = [&]() {
    EXPECT_TRUE(mlp.forward(*k, x.data(), batch).isOk());
    double s = 0;
    for (int64_t i = 0; i < batch * 3; ++i) s += double(mlp.output()[i]) * r[size_t(i)];
    return s;
  };
  loss();
  std::vector<float> dx(size_t(batch * 7));
  ASSERT_TRUE(mlp.backward(*k, r.data(), dx.data()).isOk());
  const std::vector<float> grads(params.grads(), params.grads() + params.size());
  for (int64_t i = 0; i < params.size(); i += 3) {
    expectGradClose(grads[size_t(i)], numericGrad(params.weights() + i, loss, 2e-3f), "weight", i);
  }
  for (int64_t i = 0; i < batch * 7; ++i) expectGradClose(dx[size_t(i)], numericGrad(&x[size_t(i)], loss, 2e-3f), "input", i);
}

TEST(DlrmModelTest, GradientsMatchFiniteDifferences) {
  auto k = kernels::createKernels({kernels::Device::kCpu, 2});
  DlrmShape shape;
  shape.numDense = 5;
  shape.numTables = 3;
  shape.embeddingDim = 4;
  shape.bottom = {6, 4};
  shape.top = {8};
  DlrmModel model(shape, sgd(), 9);
  EXPECT_EQ(model.interactionWidth(), 4 + 6);
  Rng rng(2);
  const int64_t batch = 5;
  auto dense = randomVector(rng, batch * 5);
  std::vector<std::vector<float>> emb(3);
  std::vector<const float*> embPtrs;
  for (auto& e : emb) {
    e = randomVector(rng, batch * 4, 0.5);
    embPtrs.push_back(e.data());
  }
  auto r = randomVector(rng, batch);
  std::vector<float> logits(static_cast<size_t>(batch));
  auto loss = [&]() {
    EXPECT_TRUE(model.forward(*k, dense.data(), embPtrs.data(), batch, logits.data()).isOk());
    double s = 0;
    for (int64_t i = 0; i < batch; ++i) s += double(logits[size_t(i)]) * r[size_t(i)];
    return s;
  };
  loss();
  std::vector<std::vector<float>> dEmb(3, std::vector<float>(size_t(batch * 4)));
  std::vector<float*> dEmbPtrs;
  for (auto& d : dEmb) dEmbPtrs.push_back(d.data());
  ASSERT_TRUE(model.backward(*k, r.data(), dEmbPtrs.data()).isOk());
  auto& params = model.parameters();
  const std::vector<float> grads(params.grads(), params.grads() + params.size());
  for (int64_t i = 0; i < params.size(); i += 2) {
    expectGradClose(grads[size_t(i)], numericGrad(params.weights() + i, loss, 2e-3f), "weight", i);
  }
  for (int t = 0; t < 3; ++t) {
    for (int64_t i = 0; i < batch * 4; ++i) {
      expectGradClose(dEmb[size_t(t)][size_t(i)], numericGrad(&emb[size_t(t)][size_t(i)], loss, 2e-3f), "embedding",
                      t * 1000 + i);
    }
  }
}

TEST(DlrmModelTest, SameSeedSameWeightsAndShapeChecks) {
  DlrmShape shape;
  DlrmModel a(shape, sgd(), 5), b(shape, sgd(), 5), c(shape, sgd(), 6);
  ASSERT_EQ(a.parameters().size(), b.parameters().size());
  EXPECT_EQ(std::vector<float>(a.parameters().weights(), a.parameters().weights() + a.parameters().size()),
            std::vector<float>(b.parameters().weights(), b.parameters().weights() + b.parameters().size()));
  EXPECT_NE(a.parameters().weights()[10], c.parameters().weights()[10]);
  shape.bottom = {64, 8};  // must end at the embedding dim (16)
  EXPECT_THROW(DlrmModel(shape, sgd(), 1), std::exception);
}

}  // namespace
}  // namespace troupe::workers
