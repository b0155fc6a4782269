// A step whose compressed all-reduce fails is undone with the residuals
// of error feedback (WorkerCore's Undo): what the step's encodings held
// back must not be sent again when the step is redone. The exact-count
// model's 8 dense gradients go through top-k (half of them) in a group of
// two identical ranks, then the group fails.
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/compressed_allreduce.h"
#include "workers/worker_core.h"

namespace troupe::workers {
namespace {

using transport::DType;

// Two ranks holding the same bytes: a gather doubles this rank's block;
// once `fail` is set every collective fails as a lost peer makes it.
class TwinComm final : public collectives::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const char* backend() const override { return "twin"; }
  Status allReduce(void* data, size_t count, DType dtype, collectives::ReduceOp op) override {
    if (fail) return Status::unavailable("rank 1 is down");
    if (dtype == DType::kFloat32 && op == collectives::ReduceOp::kSum) {
      auto* f = static_cast<float*>(data);
      for (size_t i = 0; i < count; ++i) f[i] *= 2;
    }
    return Status::ok();
  }
  Status broadcast(void*, size_t, int) override { return fail ? Status::unavailable("rank 1 is down") : Status::ok(); }
  Status allGather(const void* in, void* out, size_t bytes) override {
    if (fail) return Status::unavailable("rank 1 is down");
    std::memcpy(out, in, bytes);
    std::memcpy(static_cast<std::byte*>(out) + bytes, in, bytes);
    return Status::ok();
  }
  Expected<std::vector<std::vector<std::byte>>> allGatherV(const void*, size_t) override {
    return std::vector<std::vector<std::byte>>{};
  }
  Status barrier() override { return Status::ok(); }
  bool fail = false;
};

Batch twoRows() {
  Batch b;
  b.rows = 2;
  b.numTables = 1;
  b.keys = {5, 7};
  b.labels = {0, 0};
  return b;
}

TEST(CompressionUndo, AFailedStepForgetsWhatItsEncodingsHeldBack) {
  auto comm = std::make_shared<TwinComm>();
  kernels::CodecOptions codec;
  codec.kind = kernels::CodecKind::kTopK;
  codec.fraction = 0.5;
  auto reducer = std::make_shared<collectives::CompressedAllReduce>(codec, 0);
  WorkerCoreOptions o;
  o.kind = ModelKind::kCount;
  o.dlrm.numTables = 1;
  o.dlrm.embeddingDim = 2;
  o.dlrm.numDense = 0;
  o.denseOptimizer.kind = kernels::OptimizerKind::kSgd;
  o.denseOptimizer.learningRate = 1;
  o.threads = 1;
  o.comm = comm;
  o.compression = reducer;
  WorkerCore core(o);
  const Batch batch = twoRows();
  auto reply = [](const ps::PullRequest& pull) {
    auto r = std::make_shared<ps::PullReply>();
    r->rows.resize(pull.keys.size());
    for (size_t t = 0; t < pull.keys.size(); ++t) r->rows[t].assign(pull.keys[t].size() * 2, 0.0f);
    return r;
  };
  auto pull = core.prepare(batch, true);
  ASSERT_TRUE(pull.hasValue());
  ASSERT_TRUE(core.trainStep(batch, reply(**pull)).hasValue());
  // 8 gradients of -2 (two rows) each; top-k sent 4: the other 4 wait.
  std::vector<float> held = reducer->residuals(0);
  ASSERT_EQ(held.size(), size_t(kCountDense));
  int waiting = 0;
  for (float v : held) waiting += v == -2.0f ? 1 : 0;
  EXPECT_EQ(waiting, 4);
  EXPECT_EQ(core.steps(), 1);
  // The group fails in the next step's reduction: the step is undone, and
  // so is what its encoding moved into the residuals.
  comm->fail = true;
  pull = core.prepare(batch, true);
  ASSERT_TRUE(pull.hasValue());
  auto failed = core.trainStep(batch, reply(**pull));
  ASSERT_FALSE(failed.hasValue());
  EXPECT_NE(failed.status().message().find("rank 1 is down"), std::string::npos) << failed.status().message();
  EXPECT_EQ(core.steps(), 1);
  EXPECT_TRUE(reducer->residuals(0).empty());
}

}  // namespace
}  // namespace troupe::workers
