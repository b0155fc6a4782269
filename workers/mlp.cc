#include "workers/mlp.h"

#include <cmath>

#include "common/check.h"
#include "common/hash.h"
#include "kernels/kernels.h"
#include "workers/dense_parameters.h"

namespace troupe::workers {

int64_t Mlp::parameterCount(const std::vector<int64_t>& widths) {
  int64_t n = 0;
  for (size_t l = 0; l + 1 < widths.size(); ++l) n += widths[l] * widths[l + 1] + widths[l + 1];
  return n;
}

Mlp::Mlp(std::vector<int64_t> widths, bool reluOnOutput, DenseParameters* params, int64_t offset)
    : widths_(std::move(widths)), reluOnOutput_(reluOnOutput), params_(params) {
  if (widths_.size() < 2) TROUPE_SETUP_ERROR("an MLP needs at least an input and an output width");
  for (int64_t w : widths_) {
    if (w < 1) TROUPE_SETUP_ERROR("MLP widths must be >= 1, got {}", fmt::join(widths_, "-"));
  }
  TROUPE_CHECK(offset + parameterCount(widths_) <= params->size(), "MLP slice past the parameter buffer");
  for (size_t l = 0; l + 1 < widths_.size(); ++l) {
    offsets_.push_back(offset);
    offset += widths_[l] * widths_[l + 1] + widths_[l + 1];
  }
  outputs_.resize(widths_.size() - 1);
}

float* Mlp::weight(size_t l) { return params_->weights() + offsets_[l]; }
float* Mlp::bias(size_t l) { return weight(l) + widths_[l] * widths_[l + 1]; }
float* Mlp::weightGrad(size_t l) { return params_->grads() + offsets_[l]; }
float* Mlp::biasGrad(size_t l) { return weightGrad(l) + widths_[l] * widths_[l + 1]; }

int64_t Mlp::macsPerSample() const {
  int64_t n = 0;
  for (size_t l = 0; l + 1 < widths_.size(); ++l) n += widths_[l] * widths_[l + 1];
  return n;
}

void Mlp::initialize(uint64_t seed) {
  for (size_t l = 0; l + 1 < widths_.size(); ++l) {
    Rng rng(hashCombine(seed, 0x6d6c70ULL, l));
    const double bound = 1.0 / std::sqrt(double(widths_[l]));
    const int64_t n = widths_[l] * widths_[l + 1] + widths_[l + 1];
    float* w = weight(l);
    for (int64_t i = 0; i < n; ++i) w[i] = float((2.0 * rng.uniform() - 1.0) * bound);
  }
}

Status Mlp::forward(kernels::Kernels& k, const float* x, int64_t batch) {
  input_ = x;
  batch_ = batch;
  const float* in = x;
  for (size_t l = 0; l + 1 < widths_.size(); ++l) {
    auto& y = outputs_[l];
    y.resize(size_t(batch * widths_[l + 1]));
    Status s = k.denseForward(in, weight(l), bias(l), batch, widths_[l], widths_[l + 1], y.data());
    if (!s.isOk()) return s;
    if (reluAfter(l)) k.reluForward(y.data(), int64_t(y.size()), y.data());
    in = y.data();
  }
  return Status::ok();
}

std::vector<std::pair<int64_t, int64_t>> Mlp::gradientOrder() const {
  std::vector<std::pair<int64_t, int64_t>> order;
  for (size_t l = widths_.size() - 1; l-- > 0;) order.emplace_back(offsets_[l], widths_[l] * widths_[l + 1] + widths_[l + 1]);
  return order;
}

Mlp::Activations Mlp::takeActivations() {
  Activations a{input_, batch_, std::move(outputs_)};
  outputs_.assign(widths_.size() - 1, {});
  input_ = nullptr;
  batch_ = 0;
  return a;
}

void Mlp::restoreActivations(Activations&& a) {
  TROUPE_CHECK(a.outputs.size() == widths_.size() - 1, "MLP activations of {} layers for {}", a.outputs.size(),
               widths_.size() - 1);
  input_ = a.input;
  batch_ = a.batch;
  outputs_ = std::move(a.outputs);
}

Status Mlp::backward(kernels::Kernels& k, const float* dOut, float* dx, bool accumulate) {
  const int64_t batch = batch_;
  const float* dy = dOut;
  for (size_t l = widths_.size() - 1; l-- > 0;) {
    const int64_t out = widths_[l + 1];
    const float* y = outputs_[l].data();
    if (reluAfter(l)) {
      gradA_.resize(size_t(batch * out));
      k.reluBackward(y, dy, batch * out, gradA_.data());
      dy = gradA_.data();
    }
    const float* in = l == 0 ? input_ : outputs_[l - 1].data();
    float* dIn = nullptr;
    if (l > 0) {
      gradB_.resize(size_t(batch * widths_[l]));
      dIn = gradB_.data();
    } else {
      dIn = dx;
    }
    Status s = k.denseBackward(in, weight(l), dy, batch, widths_[l], out, dIn, weightGrad(l), biasGrad(l), accumulate);
    if (!s.isOk()) return s;
    if (gradReady_) gradReady_(offsets_[l], widths_[l] * out + out);
    if (l > 0) {
      gradA_.swap(gradB_);
      dy = gradA_.data();
    }
  }
  return Status::ok();
}

}  // namespace troupe::workers
