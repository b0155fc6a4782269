#include "workers/worker_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include <cstring>
#include <unordered_map>

#include "collectives/compressed_allreduce.h"
#include "workers/pipeline_actor.h"
#include "collectives/gradient_buckets.h"
#include "common/check.h"
#include "kernels/kernels.h"
#include "kernels/metrics.h"
#include "workers/dense_parameters.h"
#include "workers/mlp.h"

namespace troupe::workers {
namespace {

// Adds the seconds from its making to its end to *total.
struct Timed {
  double* total;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~Timed() { *total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
};

}  // namespace

WorkerCore::WorkerCore(const WorkerCoreOptions& options)
    : options_(options),
      kernels_(options.kernels ? options.kernels
                               : std::shared_ptr<kernels::Kernels>(
                                     kernels::createKernels({kernels::Device::kCpu, options.threads}))) {
  if (options_.kind == ModelKind::kDlrm) {
    dlrm_ = std::make_unique<DlrmModel>(options_.dlrm, options_.denseOptimizer, options_.seed);
    if (options_.pipeline) {
      // Its two stages hold the dense weights and optimizer state (the
      // tables stay where they are); the core keeps a copy of the weights.
      if (options_.pipeline->parameterCount() != dlrm_->parameters().size()) {
        TROUPE_SETUP_ERROR("pipeline of {} weights for a DLRM of {}", options_.pipeline->parameterCount(),
                           dlrm_->parameters().size());
      }
      if (options_.comm || options_.denseOnServers || options_.keepPrevious || options_.replicatedTables) {
        TROUPE_SETUP_ERROR("a DLRM's pipeline stages run in one process; their gradients are not all-reduced or "
                           "pushed yet");
      }
      options_.pipeline->loadWeights(dlrm_->parameters().weights());
    }
  } else if (options_.kind == ModelKind::kMlp) {
    params_ = std::make_unique<DenseParameters>(Mlp::parameterCount(options_.mlpWidths), options_.denseOptimizer);
    mlp_ = std::make_unique<Mlp>(options_.mlpWidths, false, params_.get(), 0);
    mlp_->initialize(options_.seed);
    if (options_.pipeline) {
      // The stages hold the weights and optimizer state; the core keeps a
      // copy of the weights. What works on its optimizer state (checkpoints,
      // a step undone for a group formed again) has no pipeline yet.
      if (options_.pipeline->parameterCount() != params_->size()) {
        TROUPE_SETUP_ERROR("pipeline of {} weights for an MLP of {}", options_.pipeline->parameterCount(),
                           params_->size());
      }
      if (options_.comm || options_.denseOnServers || options_.keepPrevious) {
        TROUPE_SETUP_ERROR("pipeline stages run in one process; their gradients are not all-reduced or pushed yet");
      }
      // The stages start from the unsplit model's initial weights.
      options_.pipeline->loadWeights(params_->weights());
    }
    if (options_.stage) {
      // Every process makes the whole model from the same seed; its stage
      // takes its slice.
      if (options_.pipeline || options_.denseOnServers || options_.keepPrevious || options_.compression) {
        TROUPE_SETUP_ERROR("a pipeline stage of a job's process is all-reduced plainly over its replicas, and "
                           "alone in its process");
      }
      const auto& o = options_.stage->local().options();
      if (o.widths != options_.mlpWidths) TROUPE_SETUP_ERROR("pipeline stage of another MLP than the core's");
      options_.stage->loadWeights(params_->weights());
    }
  } else {
    params_ = std::make_unique<DenseParameters>(kCountDense, options_.denseOptimizer);  // zeros
  }
  if (options_.comm) setCommunicator(options_.comm);
  if (options_.comm && options_.denseOnServers) TROUPE_SETUP_ERROR("dense parameters are either all-reduced or on the servers, not both");
}

WorkerCore::~WorkerCore() = default;

void WorkerCore::setCommunicator(std::shared_ptr<collectives::Communicator> comm) {
  auto none = [](int64_t, int64_t) {};
  if (dlrm_) {
    dlrm_->setGradReady(none);
  } else if (mlp_) {
    mlp_->setGradReady(none);
  }
  buckets_.reset();  // its thread ends, and its reference to the old communicator goes
  options_.comm = std::move(comm);
  if (options_.compression) options_.compression->reset();  // a new group: what it owes starts again
  collectiveFailed_ = false;
  // (A pipeline stage sums its own slice's gradients over the stage group.)
  if (!options_.comm || options_.stage) return;
  // The count model has one gradient, made all at once (countStep).
  std::vector<std::pair<int64_t, int64_t>> order =
      dlrm_ ? dlrm_->gradientOrder() : mlp_ ? mlp_->gradientOrder() : std::vector<std::pair<int64_t, int64_t>>{{0, kCountDense}};
  std::vector<collectives::GradRange> ranges;
  for (const auto& [offset, count] : order) ranges.push_back({offset, count});
  buckets_ = std::make_unique<collectives::GradientBuckets>(options_.comm, dense().grads(), dense().size(), ranges,
                                                            options_.bucketBytes);
  buckets_->setCompression(options_.compression);
  auto hook = [b = buckets_.get()](int64_t offset, int64_t count) { b->ready(offset, count); };
  if (dlrm_) {
    dlrm_->setGradReady(hook);
  } else if (mlp_) {
    mlp_->setGradReady(hook);
  }
}

Expected<bool> WorkerCore::agreeToStep(int64_t rows) {
  if (!options_.comm) {
    if (collectiveFailed_) return Status::unavailable("the worker's group is gone; it has no communicator");
    agreedRows_ = rows;
    return rows > 0;
  }
  // [ranks with a batch, rows of all]: exact in float32 up to 2^24 rows a
  // step. (The replicas of a pipeline stage each count their share of the
  // batch every process reads.)
  float agree[2] = {rows > 0 ? 1.0f : 0.0f, float(options_.stage ? options_.stage->shareRows(rows) : rows)};
  Timed timed{&collectiveSeconds_};
  Status s = options_.comm->allReduce(agree, 2, transport::DType::kFloat32, collectives::ReduceOp::kSum);
  if (!s.isOk()) {
    collectiveFailed_ = true;
    return s;
  }
  agreedRows_ = int64_t(agree[1]);
  return agree[0] == float(options_.comm->size());
}

int64_t WorkerCore::denseStateFloats() const {
  return dlrm_ ? dlrm_->parameters().blockFloats() : params_->blockFloats();
}

float* WorkerCore::denseState() { return dense().block(); }

Status WorkerCore::revertLastStep() {
  if (!hasPrevious_) return Status::internal("there is no step to go back from");
  if (options_.compression) options_.compression->reset();  // (as a failed step's Undo)
  std::copy(previous_.begin(), previous_.end(), dense().block());
  steps_ -= 1;
  sequence_ -= 1;
  samplesApplied_ = prevSamples_;
  hasPrevious_ = false;
  return Status::ok();
}

void WorkerCore::setPosition(int64_t steps, int64_t samplesApplied) {
  steps_ = steps;
  sequence_ = steps;
  samplesApplied_ = samplesApplied;
  hasPrevious_ = false;
}

Status WorkerCore::finishDenseSync() {
  if (!options_.comm) {
    if (collectiveFailed_) return Status::unavailable("the worker's group is gone; it has no communicator");
    return Status::ok();
  }
  if (!buckets_) return Status::ok();
  Timed timed{&collectiveSeconds_};
  Status s = buckets_->finish();
  if (!s.isOk()) collectiveFailed_ = true;
  return s;
}

Status WorkerCore::mergePushes(ps::PushRequest* push) {
  const int tables = int(push->keys.size());
  const int64_t dim = options_.dlrm.embeddingDim;
  // This rank's push as bytes: per table, u64 n | n keys | n x dim floats.
  std::vector<std::byte> mine;
  for (int t = 0; t < tables; ++t) {
    const uint64_t n = push->keys[size_t(t)].size();
    const size_t at = mine.size();
    mine.resize(at + 8 + n * 8 + n * size_t(dim) * 4);
    std::memcpy(mine.data() + at, &n, 8);
    std::memcpy(mine.data() + at + 8, push->keys[size_t(t)].data(), n * 8);
    std::memcpy(mine.data() + at + 8 + n * 8, push->grads[size_t(t)].data(), n * size_t(dim) * 4);
  }
  if (!options_.comm) {
    collectiveFailed_ = true;
    return Status::unavailable("replicated tables: the worker's group is gone; it has no communicator");
  }
  auto all = [&] {
    Timed timed{&collectiveSeconds_};  // (the gather, not the merge below)
    return options_.comm->allGatherV(mine.data(), mine.size());
  }();
  if (!all.hasValue()) {
    collectiveFailed_ = true;
    return all.status();
  }
  const int ranks = int(all->size());
  std::vector<size_t> at(size_t(ranks), 0);
  const float scale = 1.0f / float(ranks);
  for (int t = 0; t < tables; ++t) {
    std::vector<uint64_t> keys;
    std::vector<float> grads;
    std::unordered_map<uint64_t, int64_t> index;
    for (int r = 0; r < ranks; ++r) {
      const auto& buf = (*all)[size_t(r)];
      uint64_t n = 0;
      if (at[size_t(r)] + 8 > buf.size()) return Status::corruption(fmt::format("rank {} sent a short push", r));
      std::memcpy(&n, buf.data() + at[size_t(r)], 8);
      const size_t need = 8 + n * 8 + n * size_t(dim) * 4;
      if (n > buf.size() || at[size_t(r)] + need > buf.size()) {
        return Status::corruption(fmt::format("rank {} sent a push of {} keys in {} bytes", r, n, buf.size()));
      }
      const std::byte* k = buf.data() + at[size_t(r)] + 8;
      const std::byte* g = k + n * 8;
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t key;
        std::memcpy(&key, k + i * 8, 8);
        auto [it, fresh] = index.emplace(key, int64_t(keys.size()));
        if (fresh) {
          keys.push_back(key);
          grads.resize(grads.size() + size_t(dim), 0.0f);
        }
        float* dst = grads.data() + it->second * dim;
        for (int64_t d = 0; d < dim; ++d) {
          float v;
          std::memcpy(&v, g + (i * uint64_t(dim) + uint64_t(d)) * 4, 4);
          dst[d] += v;
        }
      }
      at[size_t(r)] += need;
    }
    for (float& v : grads) v *= scale;
    push->keys[size_t(t)] = std::move(keys);  // (unique: one entry per key of `index`)
    push->grads[size_t(t)] = std::move(grads);
  }
  return Status::ok();
}

int64_t WorkerCore::macsPerSample() const {
  return dlrm_ ? dlrm_->macsPerSample() : mlp_ ? mlp_->macsPerSample() : 0;
}
int64_t WorkerCore::denseParameters() const { return dlrm_ ? dlrm_->parameters().size() : params_->size(); }
const float* WorkerCore::denseWeights() const { return dlrm_ ? dlrm_->parameters().weights() : params_->weights(); }

void WorkerCore::resumeAt(int64_t steps) {
  steps_ = steps;
  sequence_ = steps;
}

void WorkerCore::setDenseLearningRateScale(double scale) {
  denseLrScale_ = scale;  // (ps mode: the shards apply it, with each push)
  const float lr = float(double(options_.denseOptimizer.learningRate) * scale);
  dense().setLearningRate(lr);
  if (options_.pipeline) options_.pipeline->setLearningRate(lr);
  if (options_.stage) options_.stage->setLearningRate(lr);
}

Status WorkerCore::assembleModel(std::chrono::milliseconds timeout, bool state) {
  if (!options_.stage) return Status::ok();
  return options_.stage->gatherWeights(state ? params_->block() : params_->weights(), steps_, timeout, state,
                                       params_->size());
}

void WorkerCore::denseStateLoaded() {
  if (options_.stage) options_.stage->loadState(params_->block(), params_->size(), steps_);
}

int64_t WorkerCore::trainedRows(const Batch& batch) const {
  return options_.stage ? options_.stage->shareRows(batch.rows) : batch.rows;
}

double WorkerCore::takeMeanLoss() {
  const double mean = lossCount_ ? lossSum_ / double(lossCount_) : std::nan("");
  lossSum_ = 0;
  lossCount_ = 0;
  return mean;
}

DenseParameters& WorkerCore::dense() { return dlrm_ ? dlrm_->parameters() : *params_; }

Expected<ps::PullRequestPtr> WorkerCore::prepare(const Batch& batch, bool create) {
  auto req = std::make_shared<ps::PullRequest>();
  req->create = create;
  req->step = steps_;
  req->dense = options_.denseOnServers;
  if (!hasTables()) return ps::PullRequestPtr(std::move(req));
  const int tables = options_.dlrm.numTables;
  if (batch.numTables != tables || int64_t(batch.keys.size()) != batch.rows * tables) {
    return Status::invalidArgument(
        fmt::format("batch has {} tables ({} keys for {} rows), the model {}", batch.numTables, batch.keys.size(),
                    batch.rows, tables));
  }
  req->keys.resize(size_t(tables));
  uniqueKeys_.resize(size_t(tables));
  inverse_.resize(size_t(tables));
  columns_.resize(size_t(tables));
  tableStatus_.assign(size_t(tables), Status::ok());
  // The tables side by side (each its own column, dedup and buffers).
  kernels_->forEachIndependent(tables, [&](int64_t t) {
    auto& column = columns_[size_t(t)];
    column.resize(size_t(batch.rows));
    for (int64_t r = 0; r < batch.rows; ++r) column[size_t(r)] = batch.keys[size_t(r * tables + t)];
    auto& unique = uniqueKeys_[size_t(t)];
    unique.resize(size_t(batch.rows));
    inverse_[size_t(t)].resize(size_t(batch.rows));
    auto n = kernels_->uniqueKeys(column.data(), batch.rows, unique.data(), inverse_[size_t(t)].data());
    if (!n.hasValue()) {
      tableStatus_[size_t(t)] = n.status();
      return;
    }
    unique.resize(size_t(*n));
  });
  for (int t = 0; t < tables; ++t) {
    if (!tableStatus_[size_t(t)].isOk()) return tableStatus_[size_t(t)];
    const auto& unique = uniqueKeys_[size_t(t)];
    if (create) pulledRows_ += int64_t(unique.size());
    req->keys[size_t(t)] = unique;
  }
  return ps::PullRequestPtr(std::move(req));
}

Status WorkerCore::checkReply(const ps::PullReply* reply) const {
  const int tables = options_.dlrm.numTables;
  const int64_t dim = options_.dlrm.embeddingDim;
  if (!reply) return Status::invalidArgument("a step of a model with tables needs the pulled rows");
  if (int(reply->rows.size()) != tables || int(uniqueKeys_.size()) != tables) {
    return Status::invalidArgument(fmt::format("pull reply has {} tables, the model {}", reply->rows.size(), tables));
  }
  for (int t = 0; t < tables; ++t) {
    const int64_t numRows = int64_t(uniqueKeys_[size_t(t)].size());
    if (int64_t(reply->rows[size_t(t)].size()) != numRows * dim) {
      return Status::invalidArgument(fmt::format("pull reply for table {} has {} floats, expected {} x {}", t,
                                                 reply->rows[size_t(t)].size(), numRows, dim));
    }
  }
  return Status::ok();
}

Status WorkerCore::embedBatch(const Batch& batch, const ps::PullReplyPtr& rows) {
  if (!rows) return Status::invalidArgument("a DLRM step needs the pulled rows");
  if (batch.denseWidth != options_.dlrm.numDense) {
    return Status::invalidArgument(
        fmt::format("batch has {} dense features, the model {}", batch.denseWidth, options_.dlrm.numDense));
  }
  return embed(batch, *rows);
}

Status WorkerCore::checkMlpBatch(const Batch& batch) const {
  if (batch.denseWidth == mlp_->inputWidth()) return Status::ok();
  return Status::invalidArgument(
      fmt::format("batch has {} features, the MLP takes {}", batch.denseWidth, mlp_->inputWidth()));
}

Status WorkerCore::embed(const Batch& batch, const ps::PullReply& reply) {
  const int tables = options_.dlrm.numTables;
  const int64_t dim = options_.dlrm.embeddingDim;
  const int64_t rows = batch.rows;
  Status s = checkReply(&reply);
  if (!s.isOk()) return s;
  // Every table in one embedding-bag call: the pulled rows of all tables one
  // after another, bags ordered table-major (table t's bags are
  // [t * rows, (t + 1) * rows)), so table t's pooled output is one block.
  rowOffset_.assign(size_t(tables) + 1, 0);
  for (int t = 0; t < tables; ++t) {
    rowOffset_[size_t(t) + 1] = rowOffset_[size_t(t)] + int64_t(uniqueKeys_[size_t(t)].size());
  }
  const int64_t totalRows = rowOffset_.back();
  allRows_.resize(size_t(totalRows * dim));
  allIndices_.resize(size_t(tables * rows));
  for (int t = 0; t < tables; ++t) {
    const auto& src = reply.rows[size_t(t)];
    std::copy(src.begin(), src.end(), allRows_.begin() + rowOffset_[size_t(t)] * dim);
    const int64_t* inverse = inverse_[size_t(t)].data();
    int64_t* indices = allIndices_.data() + t * rows;
    for (int64_t b = 0; b < rows; ++b) indices[b] = inverse[b] + rowOffset_[size_t(t)];
  }
  offsets_.resize(size_t(tables * rows + 1));
  std::iota(offsets_.begin(), offsets_.end(), int64_t{0});
  pooled_.resize(size_t(tables * rows * dim));
  pooledPtrs_.resize(size_t(tables));
  for (int t = 0; t < tables; ++t) pooledPtrs_[size_t(t)] = pooled_.data() + t * rows * dim;
  return kernels_->embeddingBagForward(allRows_.data(), totalRows, dim, allBags(rows), pooled_.data());
}

kernels::EmbeddingBags WorkerCore::allBags(int64_t rows) const {
  kernels::EmbeddingBags bags;
  bags.indices = kernels::BagIndices::of(allIndices_.data(), int64_t(allIndices_.size()));
  bags.offsets = offsets_.data();
  bags.batch = int64_t(options_.dlrm.numTables) * rows;
  return bags;
}

Status WorkerCore::forward(const Batch& batch, const ps::PullReplyPtr& rows) {
  if (options_.denseOnServers) {
    DenseParameters& p = dense();
    if (!rows || int64_t(rows->dense.size()) != p.size()) {
      return Status::invalidArgument(fmt::format("pull reply has {} dense weights, the model {}",
                                                 rows ? rows->dense.size() : 0, p.size()));
    }
    std::copy(rows->dense.begin(), rows->dense.end(), p.weights());
  }
  if (options_.kind == ModelKind::kCount) return checkReply(rows.get());
  logits_.resize(size_t(batch.rows * (dlrm_ ? 1 : options_.mlpWidths.back())));
  if (dlrm_) {
    Status s = embedBatch(batch, rows);
    if (!s.isOk()) return s;
    return dlrm_->forward(*kernels_, batch.dense.data(), pooledPtrs_.data(), batch.rows, logits_.data());
  }
  Status s = checkMlpBatch(batch);
  if (!s.isOk()) return s;
  s = mlp_->forward(*kernels_, batch.dense.data(), batch.rows);
  if (!s.isOk()) return s;
  std::copy_n(mlp_->output(), logits_.size(), logits_.begin());
  return Status::ok();
}

std::shared_ptr<ps::PushRequest> WorkerCore::newPush(int64_t samples) {
  auto push = std::make_shared<ps::PushRequest>();
  push->worker = options_.worker;
  push->samples = samples;
  push->sequence = sequence_++;
  push->step = steps_;
  push->clock = steps_ - 1;
  if (options_.denseOnServers) push->lrScale = std::max(denseLrScale_, 1e-30);  // (> 0 on the wire)
  return push;
}

Expected<ps::PushRequestPtr> WorkerCore::trainStep(const Batch& batch, const ps::PullReplyPtr& rows) {
  // A collective that fails undoes the step: nothing was applied yet, and
  // the counters go back (see collectiveFailed()).
  struct Undo {
    WorkerCore& core;
    const int64_t steps, sequence, lossCount;
    const double lossSum;
    bool armed = true;
    ~Undo() {
      if (!armed) return;
      // The step's encodings moved gradient into the residuals, and the
      // step is not applied: the residuals go (the whole backlog of what
      // the encodings held back, a one-off loss after a failure), rather
      // than be sent twice when the step is redone.
      if (core.options_.compression) core.options_.compression->reset();
      core.steps_ = steps;
      core.sequence_ = sequence;
      core.lossSum_ = lossSum;
      core.lossCount_ = lossCount;
    }
  } undo{*this, steps_, sequence_, lossCount_, lossSum_};
  auto out = trainStepOnce(batch, rows);
  if (out.hasValue() || !collectiveFailed_) undo.armed = false;
  if (out.hasValue()) samplesApplied_ += options_.comm ? agreedRows_ : batch.rows;
  return out;
}

Status WorkerCore::keepPreviousState() {
  if (!options_.keepPrevious) return Status::ok();
  const DenseParameters& p = dense();
  previous_.assign(p.block(), p.block() + p.blockFloats());
  prevSamples_ = samplesApplied_;
  hasPrevious_ = true;
  return Status::ok();
}

Expected<std::shared_ptr<ps::PushRequest>> WorkerCore::embeddingPush(const Batch& batch) {
  // One embedding-bag backward for every table (layout of embed()).
  const int tables = options_.dlrm.numTables;
  const int64_t dim = options_.dlrm.embeddingDim;
  const int64_t totalRows = rowOffset_.back();
  gradRows_.assign(size_t(totalRows * dim), 0.0f);
  Status s = kernels_->embeddingBagBackward(dPooled_.data(), dim, allBags(batch.rows), gradRows_.data(), totalRows);
  if (!s.isOk()) return s;
  auto push = newPush(batch.rows);
  push->keys.resize(size_t(tables));
  push->grads.resize(size_t(tables));
  for (int t = 0; t < tables; ++t) {
    push->keys[size_t(t)] = uniqueKeys_[size_t(t)];
    push->grads[size_t(t)].assign(gradRows_.begin() + rowOffset_[size_t(t)] * dim,
                                  gradRows_.begin() + rowOffset_[size_t(t) + 1] * dim);
  }
  push->keysUnique = true;  // the keys of the pull, made unique per table
  return push;
}

Expected<ps::PushRequestPtr> WorkerCore::trainStepOnce(const Batch& batch, const ps::PullReplyPtr& rows) {
  if (dlrm_ && options_.pipeline) {
    // The embeddings here; the bottom MLP in stage 0, the interaction and
    // the top MLP in stage 1; the pooled embeddings' gradients back from
    // stage 0, and the embedding bags' backward here again.
    Status s = embedBatch(batch, rows);
    if (!s.isOk()) return s;
    ++steps_;
    auto loss = options_.pipeline->step(steps_, dlrmStageRows(batch, options_.dlrm, pooledPtrs_.data()));
    if (!loss.hasValue()) return loss.status();
    options_.pipeline->copyWeights(dlrm_->parameters().weights());  // (the stages stepped their optimizers)
    lossSum_ += *loss;
    ++lossCount_;
    const std::vector<float> in = options_.pipeline->inputGradients();
    const int tables = options_.dlrm.numTables;
    const int64_t dim = options_.dlrm.embeddingDim, dense = options_.dlrm.numDense, width = dense + tables * dim;
    if (int64_t(in.size()) != batch.rows * width) {
      return Status::internal(fmt::format("pipeline: {} input gradients for {} rows of {}", in.size(), batch.rows, width));
    }
    dPooled_.resize(size_t(tables * batch.rows * dim));
    for (int64_t r = 0; r < batch.rows; ++r) {
      for (int t = 0; t < tables; ++t) {
        std::copy_n(in.data() + r * width + dense + t * dim, dim, dPooled_.data() + (t * batch.rows + r) * dim);
      }
    }
    auto push = embeddingPush(batch);
    if (!push.hasValue()) return push.status();
    return ps::PushRequestPtr(std::move(*push));
  }
  if (mlp_ && options_.pipeline) {
    // The stages run the whole step, micro-batch by micro-batch.
    Status s = checkMlpBatch(batch);
    if (!s.isOk()) return s;
    ++steps_;
    auto loss = options_.pipeline->step(steps_, std::make_shared<const Batch>(batch));
    if (!loss.hasValue()) return loss.status();
    lossSum_ += *loss;
    ++lossCount_;
    options_.pipeline->copyWeights(params_->weights());
    return ps::PushRequestPtr();
  }
  if (mlp_ && options_.stage) {
    // This process's stage of the step; its neighbours' in theirs.
    Status s = checkMlpBatch(batch);
    if (!s.isOk()) return s;
    ++steps_;
    auto loss = options_.stage->step(steps_, std::make_shared<const Batch>(batch), options_.comm.get());
    if (!loss.hasValue()) {
      // A peer went (a neighbour stage, a replica in the sum): the job's to
      // handle. (The step is not undone: every stage starts again.)
      if (loss.status().code() == Status::Code::kUnavailable) collectiveFailed_ = true;
      return loss.status();
    }
    if (options_.stage->last()) {  // (the loss is the last stage's)
      lossSum_ += *loss;
      ++lossCount_;
    }
    options_.stage->copyWeights(params_->weights());
    return ps::PushRequestPtr();
  }
  Status s = forward(batch, rows);
  if (!s.isOk()) return s;
  ++steps_;
  if (buckets_) buckets_->setStep(steps_ - 1);
  if (options_.kind == ModelKind::kCount) return countStep(batch);
  dLogits_.resize(logits_.size());
  if (dlrm_) {
    auto loss = kernels_->sigmoidCrossEntropy(logits_.data(), batch.labels.data(), batch.rows, dLogits_.data());
    if (!loss.hasValue()) return loss.status();
    lossSum_ += *loss;
    ++lossCount_;
    const int tables = options_.dlrm.numTables;
    const int64_t dim = options_.dlrm.embeddingDim;
    dPooled_.resize(size_t(tables * batch.rows * dim));
    dPooledPtrs_.resize(size_t(tables));
    for (int t = 0; t < tables; ++t) dPooledPtrs_[size_t(t)] = dPooled_.data() + t * batch.rows * dim;
    s = dlrm_->backward(*kernels_, dLogits_.data(), dPooledPtrs_.data());
    if (!s.isOk()) return s;
    auto made = embeddingPush(batch);
    if (!made.hasValue()) return made.status();
    auto push = std::move(*made);
    s = finishDenseSync();
    if (!s.isOk()) return s;
    if (options_.replicatedTables) {
      s = mergePushes(push.get());
      if (!s.isOk()) return s;
    }
    if (options_.denseOnServers) {
      const DenseParameters& p = dlrm_->parameters();
      push->denseGrads.assign(p.grads(), p.grads() + p.size());
    } else {
      s = keepPreviousState();
      if (!s.isOk()) return s;
      s = dlrm_->parameters().apply(*kernels_, steps_);
      if (!s.isOk()) return s;
    }
    return ps::PushRequestPtr(std::move(push));
  }
  auto loss = kernels_->softmaxCrossEntropy(logits_.data(), batch.classes.data(), batch.rows,
                                            options_.mlpWidths.back(), dLogits_.data());
  if (!loss.hasValue()) return loss.status();
  lossSum_ += *loss;
  ++lossCount_;
  s = mlp_->backward(*kernels_, dLogits_.data(), nullptr);
  if (!s.isOk()) return s;
  s = finishDenseSync();
  if (!s.isOk()) return s;
  if (options_.denseOnServers) {
    auto push = newPush(batch.rows);
    push->denseGrads.assign(params_->grads(), params_->grads() + params_->size());
    return ps::PushRequestPtr(std::move(push));
  }
  s = keepPreviousState();
  if (!s.isOk()) return s;
  s = params_->apply(*kernels_, steps_);
  if (!s.isOk()) return s;
  return ps::PushRequestPtr();
}

Expected<ps::PushRequestPtr> WorkerCore::countStep(const Batch& batch) {
  const int tables = options_.dlrm.numTables;
  const int64_t dim = options_.dlrm.embeddingDim;
  const float scale = float(options_.countScale);
  ++lossCount_;  // a loss of 0
  DenseParameters& p = *params_;
  std::fill_n(p.grads(), p.size(), -float(batch.rows) * scale);
  if (buckets_) buckets_->ready(0, p.size());
  Status s = finishDenseSync();
  if (!s.isOk()) return s;
  auto push = newPush(batch.rows);
  push->keys.resize(size_t(tables));
  push->grads.resize(size_t(tables));
  for (int t = 0; t < tables; ++t) {
    const auto& unique = uniqueKeys_[size_t(t)];
    std::vector<float> grads(unique.size() * size_t(dim), 0.0f);
    for (int64_t r = 0; r < batch.rows; ++r) {
      float* g = grads.data() + inverse_[size_t(t)][size_t(r)] * dim;
      for (int64_t d = 0; d < dim; ++d) g[d] -= scale;
    }
    push->keys[size_t(t)] = unique;
    push->grads[size_t(t)] = std::move(grads);
  }
  push->keysUnique = true;
  if (options_.replicatedTables) {
    s = mergePushes(push.get());
    if (!s.isOk()) return s;
  }
  if (options_.denseOnServers) {
    push->denseGrads.assign(p.grads(), p.grads() + p.size());
  } else {
    s = keepPreviousState();
    if (!s.isOk()) return s;
    s = p.apply(*kernels_, steps_);
    if (!s.isOk()) return s;
  }
  return ps::PushRequestPtr(std::move(push));
}

Status WorkerCore::countEval(const Batch& batch, const ps::PullReply& reply) {
  const int tables = options_.dlrm.numTables;
  const int64_t dim = options_.dlrm.embeddingDim;
  counted_.resize(size_t(tables));
  for (int t = 0; t < tables; ++t) {
    const auto& unique = uniqueKeys_[size_t(t)];
    std::vector<int64_t> times(unique.size(), 0);
    for (int64_t r = 0; r < batch.rows; ++r) ++times[size_t(inverse_[size_t(t)][size_t(r)])];
    for (size_t u = 0; u < unique.size(); ++u) {
      const float* row = reply.rows[size_t(t)].data() + u * size_t(dim);
      const bool fresh = counted_[size_t(t)].count(unique[u]) == 0;
      Counted& c = counted_[size_t(t)][unique[u]];
      c.times += times[u];
      // The rows hold still while the model is evaluated: a row whose
      // elements differ, or that changed since it was seen, is wrong for good.
      const bool even = std::all_of(row, row + dim, [&](float v) { return v == row[0]; });
      c.value = even && (fresh || c.value == row[0]) ? row[0] : std::nanf("");
    }
  }
  return Status::ok();
}

Status WorkerCore::evalStep(const Batch& batch, const ps::PullReplyPtr& rows, EvalResult* eval) {
  Status s = forward(batch, rows);
  if (!s.isOk()) return s;
  if (options_.kind == ModelKind::kCount) {
    s = countEval(batch, *rows);
    if (!s.isOk()) return s;
  } else if (dlrm_) {
    for (int64_t i = 0; i < batch.rows; ++i) {
      const double z = logits_[size_t(i)];
      eval->predictions.push_back(float(1.0 / (1.0 + std::exp(-z))));
      eval->labels.push_back(batch.labels[size_t(i)]);
    }
  } else {
    const int64_t classes = options_.mlpWidths.back();
    auto loss = kernels_->softmaxCrossEntropy(logits_.data(), batch.classes.data(), batch.rows, classes, nullptr);
    if (!loss.hasValue()) return loss.status();
    eval->loss += *loss * double(batch.rows);  // summed; finishEval divides
    for (int64_t i = 0; i < batch.rows; ++i) {
      const float* z = logits_.data() + i * classes;
      eval->predictions.push_back(float(std::max_element(z, z + classes) - z));
      eval->labels.push_back(float(batch.classes[size_t(i)]));
    }
  }
  eval->rows += batch.rows;
  return Status::ok();
}

void WorkerCore::finishEval(EvalResult* eval, int64_t epochs) {
  const int64_t n = int64_t(eval->labels.size());
  if (options_.kind == ModelKind::kCount) {
    // Every value is a whole number of occurrences (times the passes), so
    // one update lost or applied twice moves it by 1 at least.
    auto check = [&](double got, double want, const std::string& what) {
      ++eval->countChecked;
      if (std::fabs(got - want) <= 0.25) return;  // NaN (a row whose elements differ) fails too
      if (eval->countWrong++ < 5) {
        eval->countErrors += fmt::format("{}{}: {} instead of {}", eval->countErrors.empty() ? "" : "; ", what, got, want);
      }
    };
    for (size_t t = 0; t < counted_.size(); ++t) {
      for (const auto& [key, c] : counted_[t]) {
        check(c.value, double(c.times) * double(epochs), fmt::format("table {} key {}", t, key));
      }
    }
    for (int64_t i = 0; i < params_->size(); ++i) {
      check(params_->weights()[i], double(eval->rows) * double(epochs), fmt::format("dense parameter {}", i));
    }
    counted_.clear();
    eval->loss = 0;
    eval->accuracy = eval->countChecked ? 1.0 - double(eval->countWrong) / double(eval->countChecked) : std::nan("");
    eval->auc = std::nan("");
    return;
  }
  if (dlrm_) {
    eval->auc = kernels::rocAuc(eval->predictions.data(), eval->labels.data(), n);
    eval->loss = kernels::logLoss(eval->predictions.data(), eval->labels.data(), n);
  } else {
    int64_t correct = 0;
    for (int64_t i = 0; i < n; ++i) correct += eval->predictions[size_t(i)] == eval->labels[size_t(i)];
    eval->accuracy = n ? double(correct) / double(n) : std::nan("");
    eval->loss = n ? eval->loss / double(n) : std::nan("");
  }
}

}  // namespace troupe::workers
