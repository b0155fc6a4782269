#include "workers/dlrm_model.h"

#include <cstring>

#include "common/check.h"
#include "common/hash.h"
#include "kernels/kernels.h"

namespace troupe::workers {
namespace {

int64_t pairs(const DlrmShape& s) {
  const int64_t f = s.numTables + 1;
  return f * (f - 1) / 2;
}

int64_t topInput(const DlrmShape& s) {
  return s.embeddingDim + pairs(s) + (s.concatEmbeddings ? s.numTables * s.embeddingDim : 0);
}

int64_t totalParameters(const DlrmShape& s) {
  if (s.bottom.empty() || s.bottom.back() != s.embeddingDim) {
    TROUPE_SETUP_ERROR("DLRM: the bottom MLP must end at the embedding dim {}, got widths [{}]", s.embeddingDim,
                       fmt::join(s.bottom, ", "));
  }
  if (s.numTables < 1 || s.numDense < 1) {
    TROUPE_SETUP_ERROR("DLRM: need >= 1 table and >= 1 dense feature, got {} and {}", s.numTables, s.numDense);
  }
  return Mlp::parameterCount(DlrmModel::bottomWidths(s)) + Mlp::parameterCount(DlrmTop::widths(s));
}

}  // namespace

std::vector<int64_t> DlrmModel::bottomWidths(const DlrmShape& s) {
  std::vector<int64_t> w{s.numDense};
  w.insert(w.end(), s.bottom.begin(), s.bottom.end());
  return w;
}

std::vector<int64_t> DlrmTop::widths(const DlrmShape& s) {
  std::vector<int64_t> w{topInput(s)};
  w.insert(w.end(), s.top.begin(), s.top.end());
  w.push_back(1);
  return w;
}

DlrmTop::DlrmTop(const DlrmShape& shape, DenseParameters* params, int64_t offset)
    : shape_(shape), mlp_(std::make_unique<Mlp>(widths(shape), false, params, offset)), inWidth_(topInput(shape)) {}

Status DlrmTop::forward(kernels::Kernels& k, const float* x, const float* const* embeddings, int64_t batch) {
  batch_ = batch;
  const int64_t dim = shape_.embeddingDim;
  z_.assign(1, x);
  z_.insert(z_.end(), embeddings, embeddings + shape_.numTables);
  topIn_.resize(size_t(batch * inWidth_));
  for (int64_t b = 0; b < batch; ++b) {
    std::memcpy(topIn_.data() + b * inWidth_, x + b * dim, size_t(dim) * sizeof(float));
  }
  Status s = k.dotInteractionForward(z_.data(), int64_t(z_.size()), batch, dim, topIn_.data() + dim, inWidth_);
  if (!s.isOk()) return s;
  if (shape_.concatEmbeddings) {
    const int64_t first = dim + pairs(shape_);
    for (int64_t b = 0; b < batch; ++b) {
      float* row = topIn_.data() + b * inWidth_ + first;
      for (int t = 0; t < shape_.numTables; ++t) {
        std::memcpy(row + t * dim, embeddings[t] + b * dim, size_t(dim) * sizeof(float));
      }
    }
  }
  return mlp_->forward(k, topIn_.data(), batch);
}

Status DlrmTop::backward(kernels::Kernels& k, const float* dLogits, float* dX, float* const* dEmbeddings,
                         bool accumulate) {
  const int64_t batch = batch_, dim = shape_.embeddingDim;
  dTopIn_.resize(size_t(batch * inWidth_));
  Status s = mlp_->backward(k, dLogits, dTopIn_.data(), accumulate);
  if (!s.isOk()) return s;
  dInteractionX_.resize(size_t(batch * dim));
  dZ_.assign(1, dInteractionX_.data());
  dZ_.insert(dZ_.end(), dEmbeddings, dEmbeddings + shape_.numTables);
  s = k.dotInteractionBackward(z_.data(), int64_t(z_.size()), batch, dim, dTopIn_.data() + dim, inWidth_,
                               dZ_.data());
  if (!s.isOk()) return s;
  if (shape_.concatEmbeddings) {
    const int64_t first = dim + pairs(shape_);
    for (int64_t b = 0; b < batch; ++b) {
      const float* row = dTopIn_.data() + b * inWidth_ + first;
      for (int t = 0; t < shape_.numTables; ++t) {
        float* g = dEmbeddings[t] + b * dim;
        for (int64_t d = 0; d < dim; ++d) g[d] += row[t * dim + d];
      }
    }
  }
  // x feeds the top MLP directly and through the interaction: add both.
  for (int64_t b = 0; b < batch; ++b) {
    const float* direct = dTopIn_.data() + b * inWidth_;
    const float* viaPairs = dInteractionX_.data() + b * dim;
    float* out = dX + b * dim;
    for (int64_t d = 0; d < dim; ++d) out[d] = direct[d] + viaPairs[d];
  }
  return Status::ok();
}

DlrmTop::Activations DlrmTop::takeActivations() {
  Activations a;
  a.mlp = mlp_->takeActivations();
  a.z = std::move(z_);
  a.topIn = std::move(topIn_);
  a.batch = batch_;
  z_.clear();
  topIn_.clear();
  return a;
}

void DlrmTop::restoreActivations(Activations&& a) {
  mlp_->restoreActivations(std::move(a.mlp));
  z_ = std::move(a.z);
  topIn_ = std::move(a.topIn);
  batch_ = a.batch;
}

DlrmModel::DlrmModel(const DlrmShape& shape, const kernels::OptimizerConfig& denseOptimizer, uint64_t seed)
    : shape_(shape), params_(totalParameters(shape), denseOptimizer) {
  bottom_ = std::make_unique<Mlp>(bottomWidths(shape_), true, &params_, 0);
  top_ = std::make_unique<DlrmTop>(shape_, &params_, Mlp::parameterCount(bottomWidths(shape_)));
  bottom_->initialize(hashCombine(seed, 1));
  top_->mlp().initialize(hashCombine(seed, 2));
}

int64_t DlrmModel::macsPerSample() const {
  return bottom_->macsPerSample() + top_->mlp().macsPerSample() + pairs(shape_) * shape_.embeddingDim;
}

Status DlrmModel::forward(kernels::Kernels& k, const float* dense, const float* const* embeddings, int64_t batch,
                          float* logits) {
  batch_ = batch;
  Status s = bottom_->forward(k, dense, batch);
  if (!s.isOk()) return s;
  s = top_->forward(k, bottom_->output(), embeddings, batch);
  if (!s.isOk()) return s;
  std::memcpy(logits, top_->logits(), size_t(batch) * sizeof(float));
  return Status::ok();
}

void DlrmModel::setGradReady(const std::function<void(int64_t, int64_t)>& hook) {
  top_->mlp().setGradReady(hook);
  bottom_->setGradReady(hook);
}

std::vector<std::pair<int64_t, int64_t>> DlrmModel::gradientOrder() const {
  auto order = top_->mlp().gradientOrder();
  for (const auto& r : bottom_->gradientOrder()) order.push_back(r);
  return order;
}

Status DlrmModel::backward(kernels::Kernels& k, const float* dLogits, float* const* dEmbeddings) {
  dX_.resize(size_t(batch_ * shape_.embeddingDim));
  Status s = top_->backward(k, dLogits, dX_.data(), dEmbeddings);
  if (!s.isOk()) return s;
  return bottom_->backward(k, dX_.data(), nullptr);
}

}  // namespace troupe::workers
