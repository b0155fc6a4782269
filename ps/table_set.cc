#include "ps/table_set.h"

#include <fmt/format.h>

#include "kernels/kernels.h"

namespace troupe::ps {
namespace {

// Tables whose rows one optimizer call can update together: same dim, same
// optimizer and hyperparameters.
bool sameUpdate(const EmbeddingTableOptions& a, const EmbeddingTableOptions& b) {
  const auto &x = a.optimizer, &y = b.optimizer;
  return a.dim == b.dim && x.kind == y.kind && x.learningRate == y.learningRate && x.weightDecay == y.weightDecay &&
         x.eps == y.eps && x.initialAccumulator == y.initialAccumulator && x.beta1 == y.beta1 &&
         x.beta2 == y.beta2 && x.ftrlBeta == y.ftrlBeta && x.l1 == y.l1 && x.l2 == y.l2;
}

}  // namespace

TableSet::TableSet(const std::vector<EmbeddingTableOptions>& tables) {
  for (const auto& t : tables) {
    tables_.push_back(std::make_unique<EmbeddingTable>(t));
    dims_.push_back(t.dim);
  }
  uniform_ = !tables.empty();
  for (const auto& t : tables) uniform_ = uniform_ && sameUpdate(t, tables.front());
}

int64_t TableSet::rows() const {
  int64_t n = 0;
  for (const auto& t : tables_) n += t->size();
  return n;
}

void TableSet::pullTable(size_t t, const uint64_t* keys, int64_t n, bool create, float* out) {
  if (create) {
    tables_[t]->pull(keys, n, out);
  } else {
    tables_[t]->peek(keys, n, out);
  }
}

void TableSet::pull(const uint64_t* counts, const uint64_t* keys, bool create, float* out) {
  for (size_t t = 0; t < tables_.size(); ++t) {
    const int64_t n = int64_t(counts[t]);
    pullTable(t, keys, n, create, out);
    keys += n;
    out += n * dims_[t];
  }
}

Status TableSet::push(const uint64_t* counts, const uint64_t* keys, const float* grads, int64_t step,
                      kernels::Kernels& kernels) {
  if (!uniform_) {
    for (size_t t = 0; t < tables_.size(); ++t) {
      const int64_t n = int64_t(counts[t]);
      Status s = tables_[t]->push(keys, grads, n, step, kernels);
      if (!s.isOk()) return s;
      keys += n;
      grads += n * dims_[t];
    }
    return Status::ok();
  }
  // One optimizer call for every table's rows (same dim and optimizer).
  rows_.clear();
  grads_.clear();
  const int64_t dim = dims_.front();
  for (size_t t = 0; t < tables_.size(); ++t) {
    const int64_t n = int64_t(counts[t]);
    auto unique = tables_[t]->preparePush(keys, grads, n, kernels);
    if (!unique.hasValue()) return unique.status();
    const float* g = tables_[t]->preparedGrads();
    rows_.insert(rows_.end(), tables_[t]->preparedRows(), tables_[t]->preparedRows() + *unique);
    grads_.insert(grads_.end(), g, g + *unique * dim);
    keys += n;
    grads += n * dim;
  }
  kernels::OptimizerConfig config = tables_.front()->options().optimizer;
  config.step = step;
  return kernels.applyRowOptimizer(config, rows_.data(), int64_t(rows_.size()), dim, grads_.data());
}

std::vector<TableImage> TableSet::image() const {
  std::vector<TableImage> out;
  for (const auto& t : tables_) out.push_back(t->image());
  return out;
}

Status TableSet::load(const std::vector<TableImage>& images) {
  if (images.size() != tables_.size()) {
    return Status::invalidArgument(fmt::format("{} tables in the checkpoint, {} in the model", images.size(),
                                               tables_.size()));
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (tables_[t]->size() != 0) return Status::invalidArgument("tables hold rows already");
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    Status s = tables_[t]->load(images[t]);
    if (!s.isOk()) {
      for (auto& table : tables_) table = std::make_unique<EmbeddingTable>(table->options());  // none half-loaded
      return s;
    }
  }
  return Status::ok();
}

}  // namespace troupe::ps
