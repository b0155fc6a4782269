// Shards and the worker-side client in one process (local actors; the
// multi-process tests run the same code over the transport): consistency
// models, exact counting, duplicates, averaging in BSP, dense slices, and
// malformed messages.
#include "ps/shard.h"

#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include "ps/applied_window.h"
#include "ps/messages.h"
#include "ps/wire.h"
#include "workers/ps_client.h"
#include "workers/training_job.h"

namespace troupe::ps {
namespace {

using namespace std::chrono_literals;
constexpr auto kTimeout = std::chrono::seconds(10);

struct Job {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> system;
  std::vector<caf::actor> shards, clients;
  std::vector<EmbeddingTableOptions> tables;
  int64_t denseSize = 10;

  Job(int workers, int numShards, Consistency c, int64_t staleness = 0,
      std::chrono::milliseconds parkTimeout = std::chrono::milliseconds(0),
      kernels::OptimizerKind optimizer = kernels::OptimizerKind::kSgd, bool undoWholeSteps = false,
      std::function<void(ShardOptions&)> tweak = nullptr) {
    system = std::make_unique<caf::actor_system>(cfg);
    for (int t = 0; t < 2; ++t) {
      EmbeddingTableOptions table;
      table.tableId = t;
      table.dim = t == 0 ? 2 : 3;
      table.seed = 5;
      table.optimizer.kind = optimizer;
      table.optimizer.learningRate = 1.0f;
      tables.push_back(table);
    }
    for (int s = 0; s < numShards; ++s) {
      ShardOptions o;
      o.shard = s;
      o.shards = numShards;
      o.workers = workers;
      o.tables = tables;
      auto slice = denseSlice(denseSize, s, numShards);
      for (int64_t i = slice.first; i < slice.second; ++i) o.denseInit.push_back(float(i));
      o.denseOptimizer.kind = optimizer;
      o.denseOptimizer.learningRate = 1.0f;
      o.consistency = c;
      o.staleness = staleness;
      o.parkTimeout = parkTimeout;
      o.undoWholeSteps = undoWholeSteps;
      if (tweak) tweak(o);
      shards.push_back(spawnShard(*system, o));
    }
    for (int w = 0; w < workers; ++w) {
      workers::PsClientOptions o;
      o.worker = w;
      o.shards = shards;
      o.dims = {2, 3};
      o.denseSize = denseSize;
      o.requestTimeout = kTimeout;
      clients.push_back(workers::spawnPsClient(*system, o));
    }
  }
  ~Job() {
    caf::scoped_actor self{*system};
    for (auto& a : shards) self->send_exit(a, caf::exit_reason::user_shutdown);
    for (auto& a : clients) self->send_exit(a, caf::exit_reason::user_shutdown);
  }
};

PullRequestPtr pullOf(std::vector<std::vector<uint64_t>> keys, int64_t step, bool create = true) {
  auto r = std::make_shared<PullRequest>();
  r->keys = std::move(keys);
  r->step = step;
  r->create = create;
  r->dense = true;
  return r;
}

PushRequestPtr pushOf(int64_t worker, int64_t seq, int64_t clock, std::vector<std::vector<uint64_t>> keys,
                      float grad, float denseGrad, int64_t samples = 10) {
  auto r = std::make_shared<PushRequest>();
  r->worker = worker;
  r->samples = samples;
  r->sequence = seq;
  r->clock = clock;
  r->keys = keys;
  for (size_t t = 0; t < keys.size(); ++t) r->grads.emplace_back(keys[t].size() * (t == 0 ? 2 : 3), grad);
  r->denseGrads.assign(10, denseGrad);
  return r;
}

// Sends a pull; the reply (or nothing within `wait`) comes back to `self`.
PullReplyPtr pullNow(caf::scoped_actor& self, const caf::actor& client, PullRequestPtr req,
                     std::chrono::milliseconds wait = std::chrono::milliseconds(5000)) {
  PullReplyPtr out;
  self->request(client, wait, pull_atom::value, req)
      .receive([&](PullReplyPtr r) { out = r; }, [&](caf::error&) {});
  return out;
}

int64_t pushNow(caf::scoped_actor& self, const caf::actor& client, PushRequestPtr req) {
  int64_t ack = -1;
  self->request(client, kTimeout, push_atom::value, req)
      .receive([&](int64_t a) { ack = a; }, [&](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  return ack;
}

std::vector<float> initial(const Job& job, int table, uint64_t key) {
  std::vector<float> w(size_t(job.tables[size_t(table)].dim));
  EmbeddingTable::initialWeights(5, table, key, 1.0f / std::sqrt(float(w.size())), w.data(), int64_t(w.size()));
  return w;
}

// Every worker adds 1 to every key per step (SGD, lr 1, gradient -1), each
// push delivered twice: every key ends exactly W x steps above its start, in
// every consistency model.
TEST(Shard, ExactCountInEveryModel) {
  for (Consistency c : {Consistency::kBsp, Consistency::kSsp, Consistency::kAsp}) {
    SCOPED_TRACE(consistencyName(c));
    constexpr int kWorkers = 3, kSteps = 12;
    Job job(kWorkers, 2, c, 2);
    std::vector<std::vector<uint64_t>> keys = {{1, 2, 3, 1000, 77}, {9, 10}};
    caf::scoped_actor self{*job.system};
    // Requests from all workers interleaved: each worker pulls, then pushes
    // (twice), step by step; responses are collected asynchronously.
    int acks = 0, pulls = 0;
    for (int step = 0; step < kSteps; ++step) {
      for (int w = 0; w < kWorkers; ++w) {
        // Plain sends: the replies arrive as ordinary messages, in any order.
        self->send(job.clients[size_t(w)], pull_atom::value, pullOf(keys, step));
        auto push = pushOf(w, step, step, keys, -1.0f, 0.0f);
        for (int copy = 0; copy < 2; ++copy) {
          self->send(job.clients[size_t(w)], push_atom::value, push);
        }
      }
    }
    for (int i = 0; i < kSteps * kWorkers * 3; ++i) {
      self->receive([&](PullReplyPtr) { ++pulls; }, [&](int64_t) { ++acks; },
                    caf::after(kTimeout) >> [&] { ADD_FAILURE() << "no reply"; });
    }
    EXPECT_EQ(acks + pulls, kSteps * kWorkers * 3);
    auto reply = pullNow(self, job.clients[0], pullOf(keys, 0, false));
    ASSERT_TRUE(reply);
    for (size_t t = 0; t < keys.size(); ++t) {
      const size_t dim = t == 0 ? 2 : 3;
      for (size_t i = 0; i < keys[t].size(); ++i) {
        auto w0 = initial(job, int(t), keys[t][i]);
        for (size_t d = 0; d < dim; ++d) {
          // BSP averages each step's pushes: one +1 per step.
          const float expect = c == Consistency::kBsp ? kSteps : kWorkers * kSteps;
          EXPECT_NEAR(reply->rows[t][i * dim + d] - w0[d], expect, 1e-3) << "key " << keys[t][i];
        }
      }
    }
    // The ledger: every shard holds each worker's kSteps pushes, once each.
    for (const auto& shard : job.shards) {
      std::vector<int64_t> byWorker;
      self->request(shard, kTimeout, stats_atom::value)
          .receive([&](int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       const std::vector<int64_t>& v) { byWorker = v; },
                   [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
      EXPECT_EQ(byWorker, std::vector<int64_t>(kWorkers, kSteps));
    }
  }
}

// A pull sent now whose reply is checked later.
struct PendingPull {
  PullReplyPtr reply;
  bool failed = false;
};

TEST(Shard, BspWaitsForEveryWorkerAndAverages) {
  Job job(2, 2, Consistency::kBsp);
  caf::scoped_actor self{*job.system};
  std::vector<std::vector<uint64_t>> keys = {{42}, {}};
  auto w0 = initial(job, 0, 42);
  int acks = 0;
  self->send(job.clients[0], push_atom::value, pushOf(0, 0, 0, keys, 2.0f, 1.0f));
  // Worker 0's step-1 pull must wait for worker 1's step 0.
  EXPECT_FALSE(pullNow(self, job.clients[0], pullOf(keys, 1), 300ms)) << "BSP served a pull before the step was in";
  self->send(job.clients[1], push_atom::value, pushOf(1, 0, 0, keys, 4.0f, 3.0f));
  for (int i = 0; i < 2; ++i) self->receive([&](int64_t) { ++acks; }, caf::after(kTimeout) >> [] {});
  EXPECT_EQ(acks, 2);
  auto reply = pullNow(self, job.clients[0], pullOf(keys, 1));
  ASSERT_TRUE(reply);
  // One SGD step with the mean gradient (2 + 4) / 2.
  EXPECT_NEAR(reply->rows[0][0], w0[0] - 3.0f, 1e-5);
  EXPECT_NEAR(reply->rows[0][1], w0[1] - 3.0f, 1e-5);
  ASSERT_EQ(reply->dense.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_NEAR(reply->dense[size_t(i)], float(i) - 2.0f, 1e-5);
}

TEST(Shard, SspBoundsTheLeadAndLeaveReleases) {
  Job job(2, 1, Consistency::kSsp, 1);
  caf::scoped_actor self{*job.system};
  std::vector<std::vector<uint64_t>> keys = {{7}, {8}};
  ASSERT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 0)));
  ASSERT_EQ(pushNow(self, job.clients[0], pushOf(0, 0, 0, keys, 0, 0)), 0);
  ASSERT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 1))) << "one step ahead is within staleness 1";
  ASSERT_EQ(pushNow(self, job.clients[0], pushOf(0, 1, 1, keys, 0, 0)), 1);
  EXPECT_FALSE(pullNow(self, job.clients[0], pullOf(keys, 2), 300ms)) << "two ahead of worker 1";
  // Evaluation pulls never wait.
  EXPECT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 2, false), 2000ms));
  ASSERT_EQ(pushNow(self, job.clients[1], pushOf(1, 0, 0, keys, 0, 0)), 0);
  EXPECT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 2)));
  EXPECT_FALSE(pullNow(self, job.clients[0], pullOf(keys, 3), 300ms));
  // Worker 1 leaves: nobody holds worker 0 back any more.
  self->request(job.clients[1], kTimeout, leave_atom::value).receive([](int64_t) {}, [](caf::error&) {});
  EXPECT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 3)));
  int64_t lead = -1;
  self->request(job.shards[0], kTimeout, stats_atom::value)
      .receive([&](int64_t, int64_t, int64_t, int64_t, int64_t delayed, int64_t maxLead, int64_t, const std::vector<int64_t>&) {
        lead = maxLead;
        EXPECT_GE(delayed, 2);
      }, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  EXPECT_EQ(lead, 1);
}

// Staleness: the updates a push's gradient missed, counted from the
// serving of the worker's training pull of that step. The expected counts
// follow from the order of the messages here.
std::pair<std::vector<int64_t>, int64_t> stalenessOf(caf::scoped_actor& self, const caf::actor& shard) {
  std::pair<std::vector<int64_t>, int64_t> out{{}, -1};
  self->request(shard, kTimeout, staleness_atom::value)
      .receive([&](const std::vector<int64_t>& h, int64_t unknown) { out = {h, unknown}; },
               [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  return out;
}

TEST(Shard, EveryPushCountsTheUpdatesItsGradientMissed) {
  std::vector<std::vector<uint64_t>> keys = {{3}, {4}};
  {
    // ASP: w0 and w1 pull step 0 at update 0; w0's push applies at 0 (missed
    // 0), w1's at 1 (missed 1); w0 pulls step 1 at 2 and pushes at 2 (0);
    // w1 pulls step 1 at 3, then w0 pulls and pushes step 2 (0), and w1's
    // step 1 applies at 4 (missed 1). An evaluation pull records nothing;
    // a push whose pull the shard never served is unknown.
    Job job(2, 1, Consistency::kAsp);
    caf::scoped_actor self{*job.system};
    ASSERT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 0)));
    ASSERT_TRUE(pullNow(self, job.clients[1], pullOf(keys, 0)));
    ASSERT_EQ(pushNow(self, job.clients[0], pushOf(0, 0, 0, keys, 0.1f, 0.1f)), 0);
    ASSERT_EQ(pushNow(self, job.clients[1], pushOf(1, 0, 0, keys, 0.1f, 0.1f)), 0);
    ASSERT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 1)));
    ASSERT_EQ(pushNow(self, job.clients[0], pushOf(0, 1, 1, keys, 0.1f, 0.1f)), 1);
    ASSERT_TRUE(pullNow(self, job.clients[1], pullOf(keys, 1)));
    ASSERT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 2)));
    ASSERT_EQ(pushNow(self, job.clients[0], pushOf(0, 2, 2, keys, 0.1f, 0.1f)), 2);
    // An evaluation pull of w1's step 1 at update 4: not the pull its push is of.
    ASSERT_TRUE(pullNow(self, job.clients[1], pullOf(keys, 1, false)));
    ASSERT_EQ(pushNow(self, job.clients[1], pushOf(1, 1, 1, keys, 0.1f, 0.1f)), 1);
    ASSERT_EQ(pushNow(self, job.clients[1], pushOf(1, 2, 2, keys, 0.1f, 0.1f)), 2);  // never pulled
    // w0 pulls step 3, leaves it, pulls and pushes step 4 at update 5 (0):
    // its pull of step 3 is forgotten, and a late push of it is unknown.
    ASSERT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 3)));
    ASSERT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 4)));
    ASSERT_EQ(pushNow(self, job.clients[0], pushOf(0, 4, 4, keys, 0.1f, 0.1f)), 4);
    ASSERT_EQ(pushNow(self, job.clients[0], pushOf(0, 3, 3, keys, 0.1f, 0.1f)), 3);
    const auto [histogram, unknown] = stalenessOf(self, job.shards[0]);
    EXPECT_EQ(histogram, (std::vector<int64_t>{4, 2}));
    EXPECT_EQ(unknown, 2);
  }
  {
    // SSP, bound 0: w0's pull of step 1 parks until w1's step 0 is in; its
    // weights are of the update it is served at (2), not of its arrival (1).
    Job job(2, 1, Consistency::kSsp, 0);
    caf::scoped_actor self{*job.system};
    ASSERT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 0)));
    ASSERT_TRUE(pullNow(self, job.clients[1], pullOf(keys, 0)));
    ASSERT_EQ(pushNow(self, job.clients[0], pushOf(0, 0, 0, keys, 0.1f, 0.1f)), 0);  // update 1, missed 0
    self->send(job.clients[0], pull_atom::value, pullOf(keys, 1));  // parks; the reply comes to self
    std::this_thread::sleep_for(200ms);
    ASSERT_EQ(pushNow(self, job.clients[1], pushOf(1, 0, 0, keys, 0.1f, 0.1f)), 0);  // update 2, missed 1
    PullReplyPtr parked;
    self->receive([&](PullReplyPtr r) { parked = r; }, caf::after(kTimeout) >> [] {});
    ASSERT_TRUE(parked) << "served once w1's step 0 was in";
    ASSERT_EQ(pushNow(self, job.clients[0], pushOf(0, 1, 1, keys, 0.1f, 0.1f)), 1);  // missed 0
    const auto [histogram, unknown] = stalenessOf(self, job.shards[0]);
    EXPECT_EQ(histogram, (std::vector<int64_t>{2, 1}));
    EXPECT_EQ(unknown, 0);
  }
  {
    // BSP: a step's pushes are one update, on the weights every pull of the
    // step saw: none missed anything.
    Job job(2, 2, Consistency::kBsp);
    caf::scoped_actor self{*job.system};
    for (int64_t step = 0; step < 3; ++step) {
      for (int w = 0; w < 2; ++w) ASSERT_TRUE(pullNow(self, job.clients[size_t(w)], pullOf(keys, step)));
      for (int w = 0; w < 2; ++w) self->send(job.clients[size_t(w)], push_atom::value, pushOf(w, step, step, keys, 0.1f, 0.1f));
      for (int i = 0; i < 2; ++i) self->receive([](int64_t) {}, caf::after(kTimeout) >> [] { ADD_FAILURE() << "no ack"; });
    }
    for (const auto& shard : job.shards) {
      const auto [histogram, unknown] = stalenessOf(self, shard);
      EXPECT_EQ(histogram, (std::vector<int64_t>{6}));
      EXPECT_EQ(unknown, 0);
    }
  }
}

// Staleness-aware updates (ps.stale_lr, ps.delay_compensation), ASP, SGD at
// rate 1: w0 and w1 pull step 0 on the initial weights w; w0 pushes g0 =
// 0.1 (missed 0), then w1 pushes g1 = 0.2 (missed 1: w0's update), then w1
// pushes step 1, which it never pulled (unknown: as it is), g2 = 0.05.
//   plain:        w - g0 - g1 - g2
//   stale_lr:     w - g0 - g1 / 2 - g2
//   DC, lambda:   w - g0 - (g1 + lambda g1^2 (w_now - w)) - g2, w_now = w - g0
// for every element of the rows pushed and of the dense slice.
TEST(Shard, StalenessAwareUpdatesScaleTheRateAndCompensateTheDelay) {
  std::vector<std::vector<uint64_t>> keys = {{3}, {4}};
  const float g0 = 0.1f, g1 = 0.2f, g2 = 0.05f, lambda = 10.0f;
  struct Case {
    const char* name;
    bool staleLr;
    float dc;
    float expectedMinusW;  // what the three updates take off every weight
  };
  const float dcG1 = g1 + lambda * g1 * g1 * (-g0);
  const std::vector<Case> cases = {
      {"plain", false, 0.0f, g0 + g1 + g2},
      {"stale_lr", true, 0.0f, g0 + g1 / 2 + g2},
      {"delay_compensation", false, lambda, g0 + dcG1 + g2},
      {"both", true, lambda, g0 + dcG1 / 2 + g2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Job job(2, 1, Consistency::kAsp, 0, 0ms, kernels::OptimizerKind::kSgd, false, [&](ShardOptions& o) {
      o.staleLr = c.staleLr;
      o.delayCompensation = c.dc;
    });
    caf::scoped_actor self{*job.system};
    ASSERT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 0)));
    ASSERT_TRUE(pullNow(self, job.clients[1], pullOf(keys, 0)));
    ASSERT_EQ(pushNow(self, job.clients[0], pushOf(0, 0, 0, keys, g0, g0)), 0);
    ASSERT_EQ(pushNow(self, job.clients[1], pushOf(1, 0, 0, keys, g1, g1)), 0);
    ASSERT_EQ(pushNow(self, job.clients[1], pushOf(1, 1, 1, keys, g2, g2)), 1);
    auto now = pullNow(self, job.clients[0], pullOf(keys, 1, false));
    ASSERT_TRUE(now);
    for (int t = 0; t < 2; ++t) {
      const auto w = initial(job, t, keys[size_t(t)][0]);
      ASSERT_EQ(now->rows[size_t(t)].size(), w.size());
      for (size_t j = 0; j < w.size(); ++j) {
        EXPECT_NEAR(now->rows[size_t(t)][j], w[j] - c.expectedMinusW, 1e-6) << "table " << t << " element " << j;
      }
    }
    ASSERT_EQ(now->dense.size(), 10u);
    for (size_t i = 0; i < 10; ++i) EXPECT_NEAR(now->dense[i], float(i) - c.expectedMinusW, 1e-5) << "dense " << i;
    const auto [histogram, unknown] = stalenessOf(self, job.shards[0]);
    EXPECT_EQ(histogram, (std::vector<int64_t>{1, 1}));
    EXPECT_EQ(unknown, 1);
  }
  // The kept rows are found by key: w1 pulls keys 3 and 5 (and 4), w0
  // then updates 3 and 4 only, and w1 pushes 5 before 3. Key 5 did not
  // move (w_now = w_stale: no compensation), key 3 did.
  for (const bool staleLr : {false, true}) {
    SCOPED_TRACE(staleLr ? "with stale_lr" : "compensation only");
    Job job(2, 1, Consistency::kAsp, 0, 0ms, kernels::OptimizerKind::kSgd, false, [&](ShardOptions& o) {
      o.staleLr = staleLr;
      o.delayCompensation = lambda;
    });
    caf::scoped_actor self{*job.system};
    ASSERT_TRUE(pullNow(self, job.clients[1], pullOf({{3, 5}, {4}}, 0)));
    ASSERT_TRUE(pullNow(self, job.clients[0], pullOf({{3}, {4}}, 0)));
    ASSERT_EQ(pushNow(self, job.clients[0], pushOf(0, 0, 0, {{3}, {4}}, g0, g0)), 0);
    ASSERT_EQ(pushNow(self, job.clients[1], pushOf(1, 0, 0, {{5, 3}, {4}}, g1, g1)), 0);
    auto now = pullNow(self, job.clients[0], pullOf({{3, 5}, {4}}, 1, false));
    ASSERT_TRUE(now);
    const float rate = staleLr ? 0.5f : 1.0f;
    const auto w3 = initial(job, 0, 3), w5 = initial(job, 0, 5), w4 = initial(job, 1, 4);
    for (size_t j = 0; j < 2; ++j) {
      EXPECT_NEAR(now->rows[0][j], w3[j] - g0 - rate * dcG1, 1e-6) << "key 3, element " << j;
      EXPECT_NEAR(now->rows[0][2 + j], w5[j] - rate * g1, 1e-6) << "key 5, element " << j;
    }
    for (size_t j = 0; j < 3; ++j) EXPECT_NEAR(now->rows[1][j], w4[j] - g0 - rate * dcG1, 1e-6) << "key 4";
  }
}

// train.lr_decay in ps mode: a push's learning-rate scale reaches the
// shard's dense optimizer (SGD at rate 1: the slice moves by scale x g),
// and not the rows (the embedding rate does not decay).
TEST(Shard, APushsLearningRateScaleScalesTheDenseUpdateOnly) {
  for (Consistency c : {Consistency::kAsp, Consistency::kBsp}) {
    SCOPED_TRACE(consistencyName(c));
    Job job(1, 1, c);
    caf::scoped_actor self{*job.system};
    auto f32 = [](const std::vector<float>& v) {
      return transport::Tensor::copyOf(v.data(), v.size() * 4, transport::DType::kFloat32);
    };
    auto u64 = [](const std::vector<uint64_t>& v) {
      return transport::Tensor::copyOf(v.data(), v.size() * 8, transport::DType::kUInt64);
    };
    ASSERT_TRUE(pullNow(self, job.clients[0], pullOf({{3}, {4}}, 0)));
    int64_t ack = -1;
    self->request(job.shards[0], kTimeout,
                  pushToWire(0, 0, 0, 10, u64({1, 1}), u64({3, 4}), f32({0.1f, 0.1f, 0.1f, 0.1f, 0.1f}),
                             f32(std::vector<float>(10, 0.1f)), 0, 0.25))
        .receive([&](int64_t a) { ack = a; }, [&](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
    ASSERT_EQ(ack, 0);
    auto now = pullNow(self, job.clients[0], pullOf({{3}, {4}}, 1, false));
    ASSERT_TRUE(now);
    for (size_t i = 0; i < 10; ++i) EXPECT_NEAR(now->dense[i], float(i) - 0.25f * 0.1f, 1e-6) << "dense " << i;
    const auto w3 = initial(job, 0, 3);
    for (size_t j = 0; j < 2; ++j) EXPECT_NEAR(now->rows[0][j], w3[j] - 0.1f, 1e-6) << "row of key 3";
  }
}

// What waits in a shard now (queues_atom, the live metrics' queue depths):
// a pull parked at the SSP gate, a BSP step waiting for a worker's push.
// (The fourth figure, the shard's mailbox depth, goes to `mailbox`.)
std::vector<int64_t> queuesOf(caf::scoped_actor& self, const caf::actor& shard, int64_t* mailbox = nullptr) {
  std::vector<int64_t> out;
  self->request(shard, kTimeout, queues_atom::value)
      .receive(
          [&](int64_t parked, int64_t pending, int64_t awaiting, int64_t depth) {
            out = {parked, pending, awaiting};
            if (mailbox) *mailbox = depth;
          },
          [&](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  return out;
}

TEST(Shard, ItsQueuesSayWhatWaitsNow) {
  std::vector<std::vector<uint64_t>> keys = {{3}, {4}};
  {
    Job job(2, 1, Consistency::kSsp, 0);
    caf::scoped_actor self{*job.system};
    ASSERT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 0)));
    ASSERT_TRUE(pullNow(self, job.clients[1], pullOf(keys, 0)));
    ASSERT_EQ(pushNow(self, job.clients[0], pushOf(0, 0, 0, keys, 0.1f, 0.1f)), 0);
    int64_t mailbox = -1;
    EXPECT_EQ(queuesOf(self, job.shards[0], &mailbox), (std::vector<int64_t>{0, 0, 0}));
    EXPECT_EQ(mailbox, 0);  // nothing else was sent to it (no pull has parked, so no tick)
    self->send(job.clients[0], pull_atom::value, pullOf(keys, 1));  // parks: w1 has not pushed step 0
    std::vector<int64_t> q;
    for (int i = 0; i < 500 && q != std::vector<int64_t>{1, 0, 0}; ++i) {
      q = queuesOf(self, job.shards[0]);
      if (q != std::vector<int64_t>{1, 0, 0}) std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(q, (std::vector<int64_t>{1, 0, 0}));
    ASSERT_EQ(pushNow(self, job.clients[1], pushOf(1, 0, 0, keys, 0.1f, 0.1f)), 0);
    PullReplyPtr parked;
    self->receive([&](PullReplyPtr r) { parked = r; }, caf::after(kTimeout) >> [] {});
    ASSERT_TRUE(parked);
    EXPECT_EQ(queuesOf(self, job.shards[0]), (std::vector<int64_t>{0, 0, 0}));
  }
  {
    Job job(2, 1, Consistency::kBsp);
    caf::scoped_actor self{*job.system};
    for (int w = 0; w < 2; ++w) ASSERT_TRUE(pullNow(self, job.clients[size_t(w)], pullOf(keys, 0)));
    self->send(job.clients[0], push_atom::value, pushOf(0, 0, 0, keys, 0.1f, 0.1f));  // acknowledged with the step
    std::vector<int64_t> q;
    for (int i = 0; i < 500 && q != std::vector<int64_t>{0, 1, 0}; ++i) {
      q = queuesOf(self, job.shards[0]);
      if (q != std::vector<int64_t>{0, 1, 0}) std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(q, (std::vector<int64_t>{0, 1, 0}));
    self->send(job.clients[1], push_atom::value, pushOf(1, 0, 0, keys, 0.1f, 0.1f));
    for (int i = 0; i < 2; ++i) self->receive([](int64_t) {}, caf::after(kTimeout) >> [] { ADD_FAILURE() << "no ack"; });
    EXPECT_EQ(queuesOf(self, job.shards[0]), (std::vector<int64_t>{0, 0, 0}));
  }
}

// The summary's quantiles: nearest rank over the histogram.
TEST(Shard, StalenessQuantilesAreNearestRank) {
  auto of = [](std::vector<std::vector<int64_t>> perShard) {
    std::vector<workers::ShardSummary> shards;
    for (auto& h : perShard) {
      workers::ShardSummary s;
      s.staleness = std::move(h);
      shards.push_back(std::move(s));
    }
    return workers::summarizeStaleness(shards);
  };
  auto a = of({{98, 2}});
  EXPECT_EQ(a.pushes, 100);
  EXPECT_EQ(a.p50, 0);
  EXPECT_EQ(a.p99, 1);
  EXPECT_EQ(a.max, 1);
  EXPECT_DOUBLE_EQ(a.mean, 0.02);
  auto b = of({{99, 1}});
  EXPECT_EQ(b.p99, 0);
  auto c = of({{1}, {0, 0, 1}});  // two shards, summed
  EXPECT_EQ(c.pushes, 2);
  EXPECT_EQ(c.p50, 0);
  EXPECT_EQ(c.p99, 2);
  EXPECT_EQ(c.max, 2);
  EXPECT_DOUBLE_EQ(c.mean, 1.0);
  auto none = of({{}});
  EXPECT_EQ(none.pushes, 0);
  EXPECT_EQ(none.p50, -1);
}

TEST(Shard, AspNeverWaits) {
  Job job(3, 2, Consistency::kAsp);
  caf::scoped_actor self{*job.system};
  EXPECT_TRUE(pullNow(self, job.clients[2], pullOf({{1}, {2}}, 1000), 2000ms));
}

TEST(Shard, MalformedMessagesAreRefusedAndChangeNothing) {
  Job job(1, 1, Consistency::kAsp);
  caf::scoped_actor self{*job.system};
  std::vector<uint64_t> counts = {1}, keys = {5};
  std::vector<float> grads = {1, 2};
  auto t64 = [](const std::vector<uint64_t>& v) {
    return transport::Tensor::copyOf(v.data(), v.size() * 8, transport::DType::kUInt64);
  };
  auto f32 = [](const std::vector<float>& v) {
    return transport::Tensor::copyOf(v.data(), v.size() * 4, transport::DType::kFloat32);
  };
  std::string error;
  // One key count for a shard of two tables.
  self->request(job.shards[0], kTimeout, pushToWire(0, 0, 0, 1, t64(counts), t64(keys), f32(grads), f32({})))
      .receive([](int64_t) { ADD_FAILURE() << "accepted"; }, [&](caf::error& e) { error = caf::to_string(e); });
  EXPECT_NE(error.find("key counts"), std::string::npos) << error;
  // A worker id the job does not have.
  error.clear();
  self->request(job.shards[0], kTimeout,
                pushToWire(7, 0, 0, 1, t64({1, 0}), t64(keys), f32(grads), f32({})))
      .receive([](int64_t) { ADD_FAILURE() << "accepted"; }, [&](caf::error& e) { error = caf::to_string(e); });
  EXPECT_NE(error.find("worker 7"), std::string::npos) << error;
  int64_t rows = -1;
  self->request(job.shards[0], kTimeout, stats_atom::value)
      .receive([&](int64_t r, int64_t pushes, int64_t, int64_t, int64_t, int64_t, int64_t, const std::vector<int64_t>&) {
        rows = r;
        EXPECT_EQ(pushes, 0);
      }, [](caf::error&) {});
  EXPECT_EQ(rows, 0);
}


struct Counters {
  int64_t pushes = -1, duplicates = -1, samples = -1;
};

Counters countersOf(caf::scoped_actor& self, const caf::actor& shard) {
  Counters c;
  self->request(shard, kTimeout, stats_atom::value)
      .receive([&](int64_t, int64_t pushes, int64_t dups, int64_t, int64_t, int64_t, int64_t samples, const std::vector<int64_t>&) {
        c = Counters{pushes, dups, samples};
      }, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  return c;
}

int64_t clockOf(caf::scoped_actor& self, const caf::actor& shard, int64_t worker) {
  int64_t out = -1;
  self->request(shard, kTimeout, clock_atom::value, worker)
      .receive([&](int64_t c) { out = c; }, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  return out;
}

// Exactly once, whatever the order: a push that arrives after a later one
// of its worker is still applied (the old last-sequence check acknowledged
// it without applying it), and every re-sent push is acknowledged without
// being applied again. The ledger counts each push's samples once.
TEST(Shard, PushesOutOfOrderAreAppliedOnceAndNoneIsLost) {
  Job job(1, 1, Consistency::kAsp);
  caf::scoped_actor self{*job.system};
  std::vector<std::vector<uint64_t>> keys = {{5}, {}};
  auto w0 = initial(job, 0, 5);
  for (int64_t seq : {2, 0, 1, 0, 2, 3, 1}) EXPECT_EQ(pushNow(self, job.clients[0], pushOf(0, seq, seq, keys, -1, 0, 7)), seq);
  auto reply = pullNow(self, job.clients[0], pullOf(keys, 0, false));
  ASSERT_TRUE(reply);
  EXPECT_NEAR(reply->rows[0][0] - w0[0], 4.0f, 1e-5) << "pushes 0, 1, 2, 3 each applied once";
  const Counters c = countersOf(self, job.shards[0]);
  EXPECT_EQ(c.pushes, 4);
  EXPECT_EQ(c.duplicates, 3);
  EXPECT_EQ(c.samples, 4 * 7);
  EXPECT_EQ(clockOf(self, job.shards[0], 0), 4) << "a replacement would resume at step 4";
}

// Where a replacement resumes: the first step a shard has neither applied
// nor holds for its BSP step. Malformed asks are refused.
TEST(Shard, TheClockOfAWorkerCountsPushesHeldForTheirStep) {
  Job job(2, 1, Consistency::kBsp);
  caf::scoped_actor self{*job.system};
  std::vector<std::vector<uint64_t>> keys = {{1}, {2}};
  for (int64_t step = 0; step < 3; ++step) {
    self->send(job.clients[0], push_atom::value, pushOf(0, step, step, keys, 1, 0));
    self->send(job.clients[1], push_atom::value, pushOf(1, step, step, keys, 1, 0));
  }
  for (int i = 0; i < 6; ++i) self->receive([](int64_t) {}, caf::after(kTimeout) >> [] { ADD_FAILURE() << "no ack"; });
  // Worker 0 is a step ahead: its step 3 waits for worker 1's. (Straight
  // to the shard, so it is there before the clock is asked.)
  auto t64 = [](const std::vector<uint64_t>& v) {
    return transport::Tensor::copyOf(v.data(), v.size() * 8, transport::DType::kUInt64);
  };
  auto f32 = [](const std::vector<float>& v) {
    return transport::Tensor::copyOf(v.data(), v.size() * 4, transport::DType::kFloat32);
  };
  self->send(job.shards[0], pushToWire(0, 3, 3, 10, t64({1, 1}), t64({1, 2}), f32({1, 1, 1, 1, 1}), f32({})));
  EXPECT_EQ(clockOf(self, job.shards[0], 0), 4);
  EXPECT_EQ(clockOf(self, job.shards[0], 1), 3);
  std::string error;
  self->request(job.shards[0], kTimeout, clock_atom::value, int64_t{9})
      .receive([](int64_t) { ADD_FAILURE() << "answered"; }, [&](caf::error& e) { error = caf::to_string(e); });
  EXPECT_NE(error.find("worker 9"), std::string::npos) << error;
  // A sequence far beyond the window is refused.
  self->request(job.clients[1], kTimeout, push_atom::value,
                pushOf(1, AppliedWindow::kMaxLead + 10, AppliedWindow::kMaxLead + 10, keys, 1, 0))
      .receive([](int64_t) { ADD_FAILURE() << "accepted"; }, [&](caf::error& e) { error = caf::to_string(e); });
  EXPECT_NE(error.find("oldest unapplied push is 3"), std::string::npos) << error;
  self->send(job.clients[1], push_atom::value, pushOf(1, 3, 3, keys, 1, 0));
  for (int i = 0; i < 2; ++i) self->receive([](int64_t) {}, caf::after(kTimeout) >> [] { ADD_FAILURE() << "no ack"; });
  EXPECT_EQ(countersOf(self, job.shards[0]).samples, 8 * 10);
  EXPECT_EQ(clockOf(self, job.shards[0], 1), 4);
}

// BSP: a replacement redoing the step its lost worker had already pushed to
// this shard pulls for that step, and gets the weights as they were before
// it (what the lost worker saw), while the others' pulls for the next step
// see it applied.
TEST(Shard, APullForTheStepJustAppliedSeesTheWeightsBeforeIt) {
  Job job(2, 1, Consistency::kBsp);
  caf::scoped_actor self{*job.system};
  std::vector<std::vector<uint64_t>> keys = {{42, 43}, {7}};
  auto before = pullNow(self, job.clients[0], pullOf(keys, 0));
  ASSERT_TRUE(before);
  self->send(job.clients[0], push_atom::value, pushOf(0, 0, 0, keys, 2.0f, 1.0f));
  self->send(job.clients[1], push_atom::value, pushOf(1, 0, 0, {{42}, {}}, 4.0f, 3.0f));
  for (int i = 0; i < 2; ++i) self->receive([](int64_t) {}, caf::after(kTimeout) >> [] { ADD_FAILURE() << "no ack"; });
  auto redo = pullNow(self, job.clients[1], pullOf(keys, 0));
  auto next = pullNow(self, job.clients[0], pullOf(keys, 1));
  ASSERT_TRUE(redo && next);
  EXPECT_EQ(redo->rows, before->rows) << "the redone step sees the rows before it";
  EXPECT_EQ(redo->dense, before->dense);
  EXPECT_NEAR(next->rows[0][0], before->rows[0][0] - 3.0f, 1e-5) << "mean of 2 and 4";
  EXPECT_NEAR(next->rows[0][2], before->rows[0][2] - 1.0f, 1e-5) << "key 43: only worker 0's 2, halved";
  EXPECT_NEAR(next->dense[0], before->dense[0] - 2.0f, 1e-5);
}

// A shard writes its replies into buffers it reuses without zeroing them:
// every reply holds its own rows, whatever a reply before it left there.
TEST(Shard, RepliesInReusedBuffersHoldOnlyTheirOwnRows) {
  Job job(1, 1, Consistency::kAsp);
  caf::scoped_actor self{*job.system};
  constexpr uint64_t kKeys = 6000;  // 30 000 floats a reply: a pooled buffer
  std::vector<std::vector<uint64_t>> first(2), second(2);
  for (uint64_t k = 0; k < kKeys; ++k) {
    first[0].push_back(k);
    first[1].push_back(k * 7 + 1);
    second[0].push_back(1000000 + k);
    second[1].push_back(2000000 + k * 3);
  }
  auto expect = [&](const std::vector<std::vector<uint64_t>>& keys, const PullReplyPtr& r) {
    ASSERT_TRUE(r);
    for (int t = 0; t < 2; ++t) {
      const size_t dim = size_t(job.tables[size_t(t)].dim);
      ASSERT_EQ(r->rows[size_t(t)].size(), kKeys * dim);
      for (size_t i = 0; i < kKeys; ++i) {
        const auto w = initial(job, t, keys[size_t(t)][i]);
        for (size_t d = 0; d < dim; ++d) {
          ASSERT_EQ(r->rows[size_t(t)][i * dim + d], w[d]) << "table " << t << " key " << keys[size_t(t)][i];
        }
      }
    }
    ASSERT_EQ(r->dense.size(), 10u);
    for (size_t i = 0; i < 10; ++i) EXPECT_EQ(r->dense[i], float(i));
  };
  constexpr size_t kReplyBuffer = size_t{128} << 10;  // 30 000 floats: the 128 KiB class
  // The pool is the process's: buffers of this class cached before (a run
  // of this test before, --gtest_repeat) are held aside for the test.
  std::vector<std::shared_ptr<uint64_t[]>> aside;
  for (size_t was = replyBuffers()->cachedBytes(), i = 0; i < 64; ++i, was = replyBuffers()->cachedBytes()) {
    aside.push_back(replyBuffers()->get(kReplyBuffer));
    if (replyBuffers()->cachedBytes() == was) break;  // that one was fresh: none of the class is left
  }
  // The reply's buffer is back in the pool once the client has copied the
  // rows out (on its own thread): wait for it, bounded.
  const size_t before = replyBuffers()->cachedBytes();
  auto cachedBecomes = [&](size_t want) {
    for (int i = 0; i < 5000 && replyBuffers()->cachedBytes() != want; ++i) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(20ms);  // (and stays: no second buffer released late)
    return replyBuffers()->cachedBytes() == want;
  };
  auto a = pullNow(self, job.clients[0], pullOf(first, 0));
  expect(first, a);
  ASSERT_TRUE(cachedBecomes(before + kReplyBuffer)) << replyBuffers()->cachedBytes() << " bytes cached";
  auto b = pullNow(self, job.clients[0], pullOf(second, 1));
  expect(second, b);
  // One buffer cached, not two: the second reply was written into the first's.
  ASSERT_TRUE(cachedBecomes(before + kReplyBuffer)) << replyBuffers()->cachedBytes() << " bytes cached";
  auto c = pullNow(self, job.clients[0], pullOf(first, 2));
  expect(first, c);
  auto peek = pullNow(self, job.clients[0], pullOf(second, 3, false));
  expect(second, peek);
  EXPECT_TRUE(cachedBecomes(before + kReplyBuffer));
}

// A pull parked for the clock is bounded: it fails after parkTimeout,
// naming the worker it waited for.
TEST(Shard, AParkedPullFailsAfterItsTimeoutNamingWhoItWaitedFor) {
  Job job(2, 1, Consistency::kBsp, 0, std::chrono::milliseconds(1000));
  caf::scoped_actor self{*job.system};
  std::vector<std::vector<uint64_t>> keys = {{1}, {2}};
  self->send(job.clients[0], push_atom::value, pushOf(0, 0, 0, keys, 1, 0));  // held for worker 1's step 0
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  self->request(job.clients[0], kTimeout, pull_atom::value, pullOf(keys, 1))
      .receive([](PullReplyPtr) { ADD_FAILURE() << "served"; }, [&](caf::error& e) { error = caf::to_string(e); });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(error.find("the pull for step 1 waited 1 s for worker 1 (at step 0)"), std::string::npos) << error;
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 5.0);
  // Worker 1's step lets everything through again.
  self->send(job.clients[1], push_atom::value, pushOf(1, 0, 0, keys, 1, 0));
  for (int i = 0; i < 2; ++i) self->receive([](int64_t) {}, caf::after(kTimeout) >> [] { ADD_FAILURE() << "no ack"; });
  EXPECT_TRUE(pullNow(self, job.clients[0], pullOf(keys, 1)));
}

}  // namespace
// A hybrid group going on without a lost worker (shrink): the shard undoes
// the last step it applied (rows with their Adagrad state, the dense slice,
// the counters, the applied pushes), fails what it held for later steps,
// stops waiting for the lost worker and refuses the old generation. Then
// training on gives the very bits of a shard that never saw the undone
// step (there the lost worker left after step 0); it cannot go back two
// steps, and a malformed revert changes nothing. A shard that keeps no
// whole step (ShardOptions::undoWholeSteps) refuses to undo one.
TEST(Shard, ARevertUndoesTheLastStepAsIfItNeverWas) {
  {
    Job plain(2, 1, Consistency::kBsp);
    caf::scoped_actor self{*plain.system};
    const std::vector<std::vector<uint64_t>> keys = {{1}, {}};
    self->send(plain.clients[0], push_atom::value, pushOf(0, 0, 0, keys, 1.0f, 1.0f));
    self->send(plain.clients[1], push_atom::value, pushOf(1, 0, 0, keys, 1.0f, 1.0f));
    for (int i = 0; i < 2; ++i) self->receive([](int64_t) {}, caf::after(kTimeout) >> [] {});
    std::string error;
    self->request(plain.shards[0], kTimeout, revert_atom::value, int64_t{1}, int64_t{0}, int64_t{1})
        .receive([](int64_t) {}, [&](caf::error& e) { error = caf::to_string(e); });
    EXPECT_NE(error.find("cannot go back to step 0"), std::string::npos) << error;
  }
  const auto adagrad = kernels::OptimizerKind::kAdagrad;
  Job a(2, 1, Consistency::kBsp, 0, std::chrono::milliseconds(0), adagrad, true);
  Job b(2, 1, Consistency::kBsp, 0, std::chrono::milliseconds(0), adagrad);
  caf::scoped_actor self{*a.system};
  caf::scoped_actor selfB{*b.system};
  const std::vector<std::vector<uint64_t>> keys = {{1, 2, 3}, {4, 5}};
  auto bothWorkers = [&](caf::scoped_actor& s, Job& job, int64_t step, float g0, float g1) {
    s->send(job.clients[0], push_atom::value, pushOf(0, step, step, keys, g0, g0));
    s->send(job.clients[1], push_atom::value, pushOf(1, step, step, keys, g1, g1));
    int acks = 0;
    for (int i = 0; i < 2; ++i) s->receive([&](int64_t) { ++acks; }, caf::after(kTimeout) >> [] {});
    EXPECT_EQ(acks, 2) << "step " << step;
  };
  bothWorkers(self, a, 0, 1.0f, 2.0f);
  bothWorkers(selfB, b, 0, 1.0f, 2.0f);
  bothWorkers(self, a, 1, 3.0f, 4.0f);  // undone below
  // Worker 0's step 2 waits for worker 1's, which never comes (held at the
  // shard before the revert below: its clock counts it).
  self->send(a.clients[0], push_atom::value, pushOf(0, 2, 2, keys, 5.0f, 5.0f));
  for (int i = 0; i < 500 && clockOf(self, a.shards[0], 0) < 3; ++i) std::this_thread::sleep_for(2ms);
  ASSERT_EQ(clockOf(self, a.shards[0], 0), 3);
  auto revert = [&](int64_t lost, int64_t from, int64_t generation) {
    int64_t out = -1;
    std::string error;
    self->request(a.shards[0], kTimeout, revert_atom::value, lost, from, generation)
        .receive([&](int64_t f) { out = f; }, [&](caf::error& e) { error = caf::to_string(e); });
    return std::make_pair(out, error);
  };
  EXPECT_NE(revert(1, 0, 1).second.find("cannot go back to step 0"), std::string::npos) << "two steps back";
  EXPECT_FALSE(revert(7, 1, 1).second.empty()) << "no worker 7";
  EXPECT_EQ(revert(1, 1, 1), std::make_pair(int64_t{1}, std::string()));
  std::string held;
  self->receive([&](int64_t) { held = "acknowledged"; }, [&](caf::error& e) { held = caf::to_string(e); },
                caf::after(kTimeout) >> [&] { held = "no answer"; });
  EXPECT_NE(held.find("steps from 1 were undone"), std::string::npos) << held;
  const Counters c = countersOf(self, a.shards[0]);
  EXPECT_EQ(c.pushes, 1);
  EXPECT_EQ(c.samples, 20);
  EXPECT_EQ(clockOf(self, a.shards[0], 0), 1);
  EXPECT_EQ(clockOf(self, a.shards[0], 1), 1);
  // The old group's pushes are refused; the new generation's are applied.
  std::string stale;
  self->request(a.clients[0], kTimeout, push_atom::value, pushOf(0, 1, 1, keys, 6.0f, 6.0f))
      .receive([&](int64_t) { stale = "applied"; }, [&](caf::error& e) { stale = caf::to_string(e); });
  EXPECT_NE(stale.find("generation 0"), std::string::npos) << stale;
  self->request(a.clients[0], kTimeout, generation_atom::value, int64_t{1}).receive([](int64_t) {}, [](caf::error&) {});
  // Worker 0 goes on alone, in both; worker 1 left after step 0 in b.
  selfB->request(b.clients[1], kTimeout, leave_atom::value).receive([](int64_t) {}, [](caf::error&) {});
  for (int64_t step = 1; step < 4; ++step) {
    EXPECT_EQ(pushNow(self, a.clients[0], pushOf(0, step, step, keys, 6.0f + float(step), 1.0f)), step);
    EXPECT_EQ(pushNow(selfB, b.clients[0], pushOf(0, step, step, keys, 6.0f + float(step), 1.0f)), step);
  }
  auto ra = pullNow(self, a.clients[0], pullOf(keys, 0, false));
  auto rb = pullNow(selfB, b.clients[0], pullOf(keys, 0, false));
  ASSERT_TRUE(ra);
  ASSERT_TRUE(rb);
  EXPECT_EQ(ra->rows, rb->rows) << "the rows and their Adagrad state as if step 1 of both workers never was";
  EXPECT_EQ(ra->dense, rb->dense);
  EXPECT_EQ(countersOf(self, a.shards[0]).samples, countersOf(selfB, b.shards[0]).samples);
  EXPECT_EQ(countersOf(self, a.shards[0]).pushes, countersOf(selfB, b.shards[0]).pushes);
}

}  // namespace troupe::ps
