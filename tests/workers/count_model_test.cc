// The exact-count model (WorkerCore, ModelKind::kCount): a step adds each
// key's occurrences and the batch's rows, and the evaluation finds every
// value that is not the count of the data. The counts expected here are
// worked out by hand from the batches.
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "workers/worker_core.h"

namespace troupe::workers {
namespace {

constexpr int kTables = 2;
constexpr int64_t kDim = 3;

WorkerCoreOptions countOptions(double scale) {
  WorkerCoreOptions o;
  o.kind = ModelKind::kCount;
  o.dlrm.numTables = kTables;
  o.dlrm.embeddingDim = kDim;
  o.dlrm.numDense = 0;
  o.denseOptimizer.kind = kernels::OptimizerKind::kSgd;
  o.denseOptimizer.learningRate = 1;
  o.threads = 1;
  o.countScale = scale;
  return o;
}

// Rows of (table 0 key, table 1 key).
Batch batchOf(const std::vector<std::pair<uint64_t, uint64_t>>& rows) {
  Batch b;
  b.rows = int64_t(rows.size());
  b.numTables = kTables;
  for (const auto& [a, c] : rows) {
    b.keys.push_back(a);
    b.keys.push_back(c);
  }
  b.labels.assign(rows.size(), 0.0f);
  return b;
}

const Batch kFirst = batchOf({{5, 1}, {7, 1}, {5, 2}, {5, 3}});
const Batch kSecond = batchOf({{7, 2}, {9, 2}, {5, 2}, {7, 1}});

// A reply with `value(table, key)` in every element of each pulled row.
template <typename Fn>
std::shared_ptr<ps::PullReply> replyFor(const ps::PullRequest& pull, Fn value) {
  auto reply = std::make_shared<ps::PullReply>();
  reply->rows.resize(pull.keys.size());
  for (size_t t = 0; t < pull.keys.size(); ++t) {
    for (uint64_t key : pull.keys[t]) {
      for (int64_t d = 0; d < kDim; ++d) reply->rows[t].push_back(value(int(t), key));
    }
  }
  return reply;
}

TEST(CountModel, AStepPushesEachKeysOccurrencesAndAddsTheRowsToTheDenseParameters) {
  for (double scale : {1.0, 2.0}) {
    SCOPED_TRACE(scale);
    WorkerCore core(countOptions(scale));
    EXPECT_TRUE(core.hasTables());
    auto pull = core.prepare(kFirst, true);
    ASSERT_TRUE(pull.hasValue()) << pull.status().message();
    auto push = core.trainStep(kFirst, replyFor(**pull, [](int, uint64_t) { return 0.0f; }));
    ASSERT_TRUE(push.hasValue()) << push.status().message();
    ASSERT_TRUE(*push);
    const std::map<uint64_t, float> want[kTables] = {{{5, 3}, {7, 1}}, {{1, 2}, {2, 1}, {3, 1}}};
    for (int t = 0; t < kTables; ++t) {
      const auto& keys = (*push)->keys[size_t(t)];
      ASSERT_EQ(keys.size(), want[t].size());
      for (size_t i = 0; i < keys.size(); ++i) {
        for (int64_t d = 0; d < kDim; ++d) {
          EXPECT_EQ((*push)->grads[size_t(t)][i * size_t(kDim) + size_t(d)], -want[t].at(keys[i]) * float(scale))
              << "table " << t << " key " << keys[i];
        }
      }
    }
    EXPECT_EQ((*push)->samples, 4);
    ASSERT_EQ(core.denseParameters(), kCountDense);
    for (int64_t i = 0; i < kCountDense; ++i) EXPECT_EQ(core.denseWeights()[i], 4 * float(scale));
  }
}

TEST(CountModel, TheEvaluationFindsEveryValueThatIsNotTheCountOfTheData) {
  WorkerCore core(countOptions(1));
  for (const Batch* b : {&kFirst, &kSecond}) {
    auto pull = core.prepare(*b, true);
    ASSERT_TRUE(pull.hasValue());
    ASSERT_TRUE(core.trainStep(*b, replyFor(**pull, [](int, uint64_t) { return 0.0f; })).hasValue());
  }
  // One pass over both batches: table 0 holds 5 x4, 7 x3, 9 x1; table 1
  // holds 1 x3, 2 x4, 3 x1; the dense parameters 8 rows each.
  const std::map<uint64_t, float> counts[kTables] = {{{5, 4}, {7, 3}, {9, 1}}, {{1, 3}, {2, 4}, {3, 1}}};
  auto evaluate = [&](auto value) {
    EvalResult eval;
    for (const Batch* b : {&kFirst, &kSecond}) {
      auto pull = core.prepare(*b, false);
      EXPECT_TRUE(pull.hasValue());
      Status s = core.evalStep(*b, replyFor(**pull, value), &eval);
      EXPECT_TRUE(s.isOk()) << s.message();
    }
    core.finishEval(&eval, 1);
    return eval;
  };
  EvalResult exact = evaluate([&](int t, uint64_t key) { return counts[t].at(key); });
  EXPECT_EQ(exact.countChecked, 6 + kCountDense);
  EXPECT_EQ(exact.countWrong, 0) << exact.countErrors;
  EXPECT_EQ(exact.accuracy, 1.0);
  EXPECT_EQ(exact.rows, 8);
  // One update applied twice (key 2 of table 1 one count high), and one lost.
  EvalResult wrong = evaluate([&](int t, uint64_t key) {
    const float c = counts[t].at(key);
    return t == 1 && key == 2 ? c + 1 : t == 0 && key == 9 ? c - 1 : c;
  });
  EXPECT_EQ(wrong.countChecked, 6 + kCountDense);
  EXPECT_EQ(wrong.countWrong, 2);
  EXPECT_NE(wrong.countErrors.find("table 1 key 2: 5 instead of 4"), std::string::npos) << wrong.countErrors;
  EXPECT_NE(wrong.countErrors.find("table 0 key 9: 0 instead of 1"), std::string::npos) << wrong.countErrors;
  // Twice the passes: every value is half what it must be, the dense ones too.
  EvalResult twice;
  for (const Batch* b : {&kFirst, &kSecond}) {
    auto pull = core.prepare(*b, false);
    ASSERT_TRUE(core.evalStep(*b, replyFor(**pull, [&](int t, uint64_t key) { return counts[t].at(key); }), &twice)
                    .isOk());
  }
  core.finishEval(&twice, 2);
  EXPECT_EQ(twice.countWrong, 6 + kCountDense);
  // A row whose elements differ is wrong.
  EvalResult uneven;
  for (const Batch* b : {&kFirst, &kSecond}) {
    auto pull = core.prepare(*b, false);
    auto reply = replyFor(**pull, [&](int t, uint64_t key) { return counts[t].at(key); });
    // In the first batch, the second element of table 0's first row pulled
    // (the key is seen right in the second batch: still wrong).
    if (b == &kFirst) reply->rows[0][1] += 1;
    ASSERT_TRUE(core.evalStep(*b, reply, &uneven).isOk());
  }
  core.finishEval(&uneven, 1);
  EXPECT_EQ(uneven.countWrong, 1) << uneven.countErrors;
}

}  // namespace
}  // namespace troupe::workers
