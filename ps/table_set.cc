#include "ps/table_set.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>

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

void TableSet::pullTable(size_t t, const uint64_t* keys, int64_t n, bool create, float* out, bool remember) {
  if (create) {
    tables_[t]->pull(keys, n, out, remember);
  } else {
    tables_[t]->peek(keys, n, out);
  }
}

void TableSet::pull(const uint64_t* counts, const uint64_t* keys, bool create, float* out, bool remember) {
  for (size_t t = 0; t < tables_.size(); ++t) {
    const int64_t n = int64_t(counts[t]);
    pullTable(t, keys, n, create, out, remember);
    keys += n;
    out += n * dims_[t];
  }
}

Status TableSet::push(const uint64_t* counts, const uint64_t* keys, const float* grads, int64_t step,
                      kernels::Kernels& kernels, float lrScale, bool keysUnique) {
  if (!uniform_) {
    for (size_t t = 0; t < tables_.size(); ++t) {
      const int64_t n = int64_t(counts[t]);
      Status s = tables_[t]->push(keys, grads, n, step, kernels, lrScale, keysUnique);
      if (!s.isOk()) return s;
      keys += n;
      grads += n * dims_[t];
    }
    return Status::ok();
  }
  // Each table's gradients summed and its rows found (created) side by side,
  // then one optimizer call for every table's rows (same dim and optimizer).
  rows_.clear();
  grads_.clear();
  const int64_t dim = dims_.front();
  const size_t count = tables_.size();
  firstKey_.resize(count);
  unique_.resize(count);
  status_.assign(count, Status::ok());
  int64_t first = 0;
  for (size_t t = 0; t < count; ++t) {
    firstKey_[t] = first;
    first += int64_t(counts[t]);
  }
  auto prepare = [&](int64_t i) {
    const size_t t = size_t(i);
    auto unique = tables_[t]->preparePush(keys + firstKey_[t], grads + firstKey_[t] * dim, int64_t(counts[t]), kernels,
                                          keysUnique);
    if (unique.hasValue()) {
      unique_[t] = *unique;
    } else {
      status_[t] = unique.status();
    }
  };
  // A worker's push of the keys it just pulled: every table has its rows
  // from the pull, and a hand-off to the pool would cost more than that.
  bool pulled = keysUnique;
  for (size_t t = 0; t < count && pulled; ++t) pulled = tables_[t]->pulledLast(keys + firstKey_[t], int64_t(counts[t]));
  if (pulled) {
    for (size_t t = 0; t < count; ++t) prepare(int64_t(t));
  } else {
    kernels.forEachIndependent(int64_t(count), prepare);
  }
  for (size_t t = 0; t < count; ++t) {
    if (!status_[t].isOk()) return status_[t];
    rows_.insert(rows_.end(), tables_[t]->preparedRows(), tables_[t]->preparedRows() + unique_[t]);
    if (!keysUnique) {
      const float* g = tables_[t]->preparedGrads();
      grads_.insert(grads_.end(), g, g + unique_[t] * dim);
    }
  }
  kernels::OptimizerConfig config = tables_.front()->options().optimizer;
  config.step = step;
  config.learningRate *= lrScale;
  // Unique keys: every table's gradients, back to back, are the push's own.
  return kernels.applyRowOptimizer(config, rows_.data(), int64_t(rows_.size()), dim,
                                   keysUnique ? grads : grads_.data());
}

std::vector<TableImage> TableSet::image() const {
  // Tables are copied side by side (reading only; the owner waits): the
  // copy is the pause of a checkpoint, and memory bandwidth is not used up
  // by one thread.
  std::vector<TableImage> out(tables_.size());
  const size_t threads = std::min<size_t>(tables_.size(), std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 4));
  std::atomic<size_t> next{0};
  std::mutex failedMutex;
  std::exception_ptr failed;  // the first copy that threw (out of memory, say): rethrown here
  auto work = [&] {
    try {
      for (size_t t = next++; t < tables_.size(); t = next++) out[t] = tables_[t]->image();
    } catch (...) {
      std::lock_guard<std::mutex> lock(failedMutex);
      if (!failed) failed = std::current_exception();
      next = tables_.size();  // the others stop too
    }
  };
  std::vector<std::thread> helpers;
  for (size_t i = 1; i < threads; ++i) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // no thread to be had: fewer do it
    }
  }
  work();
  for (auto& h : helpers) h.join();
  if (failed) std::rethrow_exception(failed);
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
