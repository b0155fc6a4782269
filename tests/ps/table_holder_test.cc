// The table-holder actor through its messages: pulls, pushes applied once per
// (worker, sequence) even when delivered twice, and malformed requests refused
// without changing anything.
#include "ps/table_holder.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include "kernels/profiling_kernels.h"
#include "ps/messages.h"

namespace troupe::ps {
namespace {

constexpr auto kTimeout = std::chrono::seconds(10);

class TableHolderTest : public ::testing::Test {
 protected:
  TableHolderTest() : system_(cfg_), self_(system_) {
    TableHolderOptions o;
    for (int t = 0; t < 2; ++t) {
      EmbeddingTableOptions table;
      table.tableId = t;
      table.dim = t == 0 ? 4 : 8;
      table.seed = 3;
      table.optimizer.kind = kernels::OptimizerKind::kSgd;
      table.optimizer.learningRate = 0.5f;
      o.tables.push_back(table);
    }
    holder_ = spawnTableHolder(system_, o);
  }
  ~TableHolderTest() override { self_->send_exit(holder_, caf::exit_reason::user_shutdown); }

  PullReplyPtr pull(std::vector<std::vector<uint64_t>> keys, bool create = true) {
    auto req = std::make_shared<PullRequest>();
    req->keys = std::move(keys);
    req->create = create;
    PullReplyPtr out;
    self_->request(holder_, kTimeout, pull_atom::value, PullRequestPtr(req))
        .receive([&](PullReplyPtr r) { out = r; }, [&](caf::error& e) { ADD_FAILURE() << system_.render(e); });
    return out;
  }

  // The acknowledged sequence number, or -1 with *error set.
  int64_t push(int64_t worker, int64_t seq, std::vector<std::vector<uint64_t>> keys,
               std::vector<std::vector<float>> grads, std::string* error = nullptr) {
    auto req = std::make_shared<PushRequest>();
    req->worker = worker;
    req->sequence = seq;
    req->keys = std::move(keys);
    req->grads = std::move(grads);
    int64_t ack = -1;
    self_->request(holder_, kTimeout, push_atom::value, PushRequestPtr(req))
        .receive([&](int64_t a) { ack = a; },
                 [&](caf::error& e) {
                   if (error) *error = system_.render(e);
                 });
    return ack;
  }

  int64_t rows() {
    int64_t n = -1;
    self_->request(holder_, kTimeout, stats_atom::value).receive([&](int64_t r) { n = r; }, [](caf::error&) {});
    return n;
  }

  caf::actor_system_config cfg_;
  caf::actor_system system_;
  caf::scoped_actor self_;
  caf::actor holder_;
};

TEST_F(TableHolderTest, PullGivesInitialRowsAndPushAppliesOnce) {
  auto first = pull({{7, 9}, {7}});
  ASSERT_TRUE(first);
  ASSERT_EQ(first->rows.size(), 2u);
  ASSERT_EQ(first->rows[0].size(), 8u);
  ASSERT_EQ(first->rows[1].size(), 8u);
  std::vector<float> expect(4);
  EmbeddingTable::initialWeights(3, 0, 9, 0.5f, expect.data(), 4);  // 1/sqrt(4)
  for (int d = 0; d < 4; ++d) EXPECT_EQ(first->rows[0][4 + d], expect[d]);
  EXPECT_NE(first->rows[0][0], first->rows[1][0]);  // same key, other table
  EXPECT_EQ(rows(), 3);

  std::vector<float> g0{1, 2, 3, 4}, g1(8, 1.0f);
  EXPECT_EQ(push(0, 0, {{9}, {7}}, {g0, g1}), 0);
  auto after = pull({{9}, {7}});
  for (int d = 0; d < 4; ++d) EXPECT_FLOAT_EQ(after->rows[0][d], expect[d] - 0.5f * g0[d]);
  for (int d = 0; d < 8; ++d) EXPECT_FLOAT_EQ(after->rows[1][d], first->rows[1][d] - 0.5f);

  // The same push delivered again: acknowledged, not applied twice.
  EXPECT_EQ(push(0, 0, {{9}, {7}}, {g0, g1}), 0);
  auto again = pull({{9}, {7}});
  EXPECT_EQ(again->rows[0], after->rows[0]);
  EXPECT_EQ(again->rows[1], after->rows[1]);
  // The next sequence number is applied; another worker has its own sequence.
  EXPECT_EQ(push(0, 1, {{9}, {}}, {g0, {}}), 1);
  EXPECT_EQ(push(5, 0, {{9}, {}}, {g0, {}}), 0);
  auto twice = pull({{9}, {}});
  for (int d = 0; d < 4; ++d) EXPECT_FLOAT_EQ(twice->rows[0][d], expect[d] - 1.5f * g0[d]);
}

TEST_F(TableHolderTest, EvaluationPullsDoNotGrowTheTables) {
  pull({{1}, {1}});
  EXPECT_EQ(rows(), 2);
  auto r = pull({{1, 2, 3}, {4}}, false);
  ASSERT_TRUE(r);
  std::vector<float> expect(4);
  EmbeddingTable::initialWeights(3, 0, 3, 0.5f, expect.data(), 4);
  for (int d = 0; d < 4; ++d) EXPECT_EQ(r->rows[0][8 + d], expect[d]);
  EXPECT_EQ(rows(), 2);
}

TEST_F(TableHolderTest, MalformedRequestsAreRefusedAndChangeNothing) {
  auto before = pull({{9}, {7}});
  std::string error;
  EXPECT_EQ(push(0, 0, {{9}}, {{1, 2, 3, 4}}, &error), -1);  // one table of two
  EXPECT_NE(error.find("do not match the tables"), std::string::npos) << error;
  error.clear();
  EXPECT_EQ(push(0, 0, {{9}, {}}, {{1, 2, 3}, {}}, &error), -1);  // 3 floats for dim 4
  EXPECT_NE(error.find("table 0 has 1 keys but 3 gradient floats (dim 4)"), std::string::npos) << error;
  auto req = std::make_shared<PullRequest>();
  req->keys = {{1}};
  bool failed = false;
  self_->request(holder_, kTimeout, pull_atom::value, PullRequestPtr(req))
      .receive([](PullReplyPtr) {}, [&](caf::error&) { failed = true; });
  EXPECT_TRUE(failed);
  auto after = pull({{9}, {7}});
  EXPECT_EQ(after->rows[0], before->rows[0]);
  EXPECT_EQ(after->rows[1], before->rows[1]);
  // A refused push does not use up its sequence number.
  EXPECT_EQ(push(0, 0, {{9}, {}}, {{1, 1, 1, 1}, {}}), 0);
}

// `count` tables of one dim and optimizer (the single-call path).
TableHolderOptions uniformTables(int count, int64_t dim, kernels::OptimizerKind kind, float learningRate) {
  TableHolderOptions o;
  for (int t = 0; t < count; ++t) {
    EmbeddingTableOptions table;
    table.tableId = t;
    table.dim = dim;
    table.optimizer.kind = kind;
    table.optimizer.learningRate = learningRate;
    o.tables.push_back(table);
  }
  return o;
}

// A worker's push whose keys it made unique says so (keysUnique): the
// holder then sums nothing (no dedupGradients call) and every row gets its
// one gradient, as SGD by hand says; a push that does not say so is summed.
TEST(TableHolderUniformTest, APushOfUniqueKeysIsAppliedWithoutSumming) {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  caf::scoped_actor self{system};
  TableHolderOptions o = uniformTables(2, 2, kernels::OptimizerKind::kSgd, 0.25f);
  for (auto& table : o.tables) table.seed = 5;
  const std::vector<std::vector<uint64_t>> keys = {{3, 1, 2}, {8}};
  const std::vector<std::vector<float>> grads = {{1, 2, 3, 4, 5, 6}, {-2, 2}};
  auto profiler = std::make_shared<kernels::ProfilingKernels>(kernels::createKernels({kernels::Device::kCpu, 2}));
  o.kernels = profiler;
  auto holder = spawnTableHolder(system, o);
  auto dedups = [&] {
    for (const auto& e : profiler->profile()) {
      if (e.kernel == "dedupGradients") return e.calls;
    }
    return int64_t{0};
  };
  auto push = [&](int64_t seq, bool unique) {
    auto req = std::make_shared<PushRequest>();
    req->sequence = seq;
    req->keys = keys;
    req->grads = grads;
    req->keysUnique = unique;
    int64_t ack = -1;
    self->request(holder, kTimeout, push_atom::value, PushRequestPtr(req))
        .receive([&](int64_t a) { ack = a; }, [](caf::error&) {});
    return ack;
  };
  EXPECT_EQ(push(0, true), 0);
  EXPECT_EQ(dedups(), 0);
  EXPECT_EQ(push(1, false), 1);
  EXPECT_EQ(dedups(), 2);  // one a table
  auto req = std::make_shared<PullRequest>();
  req->keys = keys;
  PullReplyPtr rows;
  self->request(holder, kTimeout, pull_atom::value, PullRequestPtr(req))
      .receive([&](PullReplyPtr r) { rows = r; }, [](caf::error&) {});
  ASSERT_TRUE(rows);
  const float scale = float(1.0 / std::sqrt(2.0));
  for (size_t t = 0; t < 2; ++t) {
    for (size_t i = 0; i < keys[t].size(); ++i) {
      float w[2];
      EmbeddingTable::initialWeights(5, int(t), keys[t][i], scale, w, 2);
      for (int d = 0; d < 2; ++d) {  // two pushes of the same gradient
        EXPECT_FLOAT_EQ(rows->rows[t][i * 2 + size_t(d)], w[d] - 2 * 0.25f * grads[t][i * 2 + size_t(d)])
            << "table " << t << " key " << keys[t][i];
      }
    }
  }
  self->send_exit(holder, caf::exit_reason::user_shutdown);
}

TEST(TableHolderUniformTest, OneOptimizerCallUpdatesEveryTableExactly) {
  // Tables of one dim and optimizer take the single-call path; duplicate keys
  // within a table are summed first, keys in different tables stay apart.
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  caf::scoped_actor self{system};
  TableHolderOptions o = uniformTables(3, 4, kernels::OptimizerKind::kAdagrad, 0.1f);
  for (auto& table : o.tables) table.optimizer.initialAccumulator = 0.0f;
  auto holder = spawnTableHolder(system, o);
  auto pull = [&] {
    auto req = std::make_shared<PullRequest>();
    req->keys = {{5}, {5}, {6}};
    PullReplyPtr out;
    self->request(holder, kTimeout, pull_atom::value, PullRequestPtr(req))
        .receive([&](PullReplyPtr r) { out = r; }, [](caf::error&) {});
    return out;
  };
  auto before = pull();
  ASSERT_TRUE(before);
  auto push = std::make_shared<PushRequest>();
  push->keys = {{5, 5}, {5}, {}};
  push->grads = {{1, 1, 1, 1, 1, 2, 3, 4}, {-1, 0, 1, 2}, {}};
  int64_t ack = -1;
  self->request(holder, kTimeout, push_atom::value, PushRequestPtr(push))
      .receive([&](int64_t a) { ack = a; }, [](caf::error&) {});
  EXPECT_EQ(ack, 0);
  auto after = pull();
  const float sum0[4] = {2, 3, 4, 5}, g1[4] = {-1, 0, 1, 2};
  for (int d = 0; d < 4; ++d) {
    // Adagrad from a zero accumulator: w -= lr * g / (|g| + eps).
    EXPECT_FLOAT_EQ(after->rows[0][d], before->rows[0][d] - 0.1f * sum0[d] / (std::fabs(sum0[d]) + 1e-8f));
    const float step1 = g1[d] == 0 ? 0.0f : 0.1f * g1[d] / (std::fabs(g1[d]) + 1e-8f);
    EXPECT_FLOAT_EQ(after->rows[1][d], before->rows[1][d] - step1);
    EXPECT_EQ(after->rows[2][d], before->rows[2][d]);
  }
  self->send_exit(holder, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe::ps
