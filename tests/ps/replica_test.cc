// Replicated shards (ps.replicas = 2; ps/wire.h, replicate ... detach) in
// one process: a primary and its backup as local actors, reached by a
// locate function over a table of made-up node ids, as a ps process reaches
// the copy in another process through its proxies. The multi-process tests
// (tests/cluster) kill and stop the processes that hold them.
#include <chrono>
#include <map>
#include <set>
#include <memory>
#include <mutex>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ps/embedding_table.h"
#include "ps/messages.h"
#include "ps/shard.h"
#include "ps/wire.h"
#include "transport/tensor.h"
#include "workers/ps_client.h"

namespace troupe::ps {
namespace {

using namespace std::chrono_literals;
constexpr auto kTimeout = std::chrono::seconds(10);
constexpr auto kQuiet = std::chrono::milliseconds(300);  // long enough for an answer that should not come

struct Copies {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> system = std::make_unique<caf::actor_system>(cfg);
  std::mutex mu;
  std::map<uint64_t, caf::actor> nodes;  // node id -> the copy there
  std::vector<caf::actor> spawned;
  std::vector<EmbeddingTableOptions> tables;
  Consistency consistency;
  int workers;

  Copies(Consistency c, int w) : consistency(c), workers(w) {
    for (int t = 0; t < 2; ++t) {
      EmbeddingTableOptions table;
      table.tableId = t;
      table.dim = t == 0 ? 2 : 3;
      table.seed = 5;
      table.optimizer.kind = kernels::OptimizerKind::kSgd;
      table.optimizer.learningRate = 1.0f;
      tables.push_back(table);
    }
  }
  ~Copies() {
    caf::scoped_actor self{*system};
    for (auto& a : spawned) self->send_exit(a, caf::exit_reason::user_shutdown);
  }

  std::function<caf::actor(uint64_t, const std::string&)> locate() {
    return [this](uint64_t node, const std::string&) {
      std::lock_guard<std::mutex> lock(mu);
      auto it = nodes.find(node);
      return it == nodes.end() ? caf::actor{} : it->second;
    };
  }

  caf::actor copy(uint64_t node, ShardOptions::Start start, caf::actor coordinator = {}, bool undoWholeSteps = false) {
    ShardOptions o;
    o.undoWholeSteps = undoWholeSteps;
    o.shard = 0;
    o.shards = 1;
    o.workers = workers;
    o.tables = tables;
    o.consistency = consistency;
    o.start = start;
    o.locate = locate();
    o.coordinator = std::move(coordinator);
    o.backupTimeout = std::chrono::milliseconds(5000);
    caf::actor a = spawnShard(*system, o);
    std::lock_guard<std::mutex> lock(mu);
    nodes[node] = a;
    spawned.push_back(a);
    return a;
  }

  caf::actor client(int64_t worker, uint64_t node, caf::actor coordinator = {},
                    std::chrono::seconds reroute = std::chrono::seconds(30)) {
    workers::PsClientOptions o;
    o.worker = worker;
    o.shards = {locate()(node, shardCopyName(0))};
    o.dims = {2, 3};
    o.denseSize = 0;
    o.requestTimeout = kTimeout;
    o.replicated = true;
    o.nodes = {node};
    o.locate = locate();
    o.coordinator = std::move(coordinator);
    o.rerouteTimeout = reroute;
    caf::actor a = workers::spawnPsClient(*system, o);
    spawned.push_back(a);
    return a;
  }
};

const std::vector<std::vector<uint64_t>> kKeys = {{1, 2, 1000}, {9}};

// Every key +1 (SGD, lr 1, gradient -1): a push per step.
PushRequestPtr pushOf(int64_t worker, int64_t seq, int64_t samples = 10) {
  auto r = std::make_shared<PushRequest>();
  r->worker = worker;
  r->sequence = seq;
  r->clock = seq;
  r->samples = samples;
  r->keys = kKeys;
  for (size_t t = 0; t < kKeys.size(); ++t) r->grads.emplace_back(kKeys[t].size() * (t == 0 ? 2 : 3), -1.0f);
  return r;
}

// How far every key moved from its initial weights (-1000 when they moved
// unequally, -2000 without an answer).
float moved(caf::scoped_actor& self, const caf::actor& client) {
  auto req = std::make_shared<PullRequest>();
  req->keys = kKeys;
  req->create = false;
  float out = -2000;
  self->request(client, kTimeout, pull_atom::value, PullRequestPtr(req))
      .receive(
          [&](PullReplyPtr r) {
            std::vector<float> deltas;
            for (size_t t = 0; t < kKeys.size(); ++t) {
              const int64_t dim = t == 0 ? 2 : 3;
              std::vector<float> w0(static_cast<size_t>(dim));
              for (size_t i = 0; i < kKeys[t].size(); ++i) {
                EmbeddingTable::initialWeights(5, int64_t(t), kKeys[t][i], 1.0f / std::sqrt(float(dim)), w0.data(),
                                               dim);
                for (int64_t d = 0; d < dim; ++d) deltas.push_back(r->rows[t][i * size_t(dim) + size_t(d)] - w0[size_t(d)]);
              }
            }
            out = deltas[0];
            for (float d : deltas) {
              if (std::abs(d - deltas[0]) > 1e-4f) out = -1000;
            }
          },
          [&](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  return out;
}

struct Stats {
  int64_t pushes = -1, duplicates = -1, samples = -1;
};

Stats statsOf(caf::scoped_actor& self, const caf::actor& shard) {
  Stats s;
  self->request(shard, kTimeout, stats_atom::value)
      .receive([&](int64_t, int64_t pushes, int64_t dups, int64_t, int64_t, int64_t,
                   int64_t samples, const std::vector<int64_t>&) { s = Stats{pushes, dups, samples}; },
               [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  return s;
}

// An acknowledgement that comes back to `self` as a plain message (the
// push was sent, not requested): its sequence, or -1 when none came.
int64_t ackWithin(caf::scoped_actor& self, std::chrono::milliseconds wait) {
  int64_t ack = -1;
  self->receive([&](int64_t seq) { ack = seq; }, [&](caf::error& e) { ADD_FAILURE() << caf::to_string(e); },
                caf::after(wait) >> [] {});
  return ack;
}

// The primary serves nothing until it has its backup, and acknowledges a
// push only once the backup answered it too: a backup that takes nothing
// (one still waiting for its state) holds the acknowledgement back until
// the job detaches it.
TEST(Replica, APushIsAcknowledgedOnlyOnceTheBackupHasIt) {
  Copies c(Consistency::kAsp, 1);
  caf::actor silent = c.copy(2, ShardOptions::Start::kAwaitImage);
  caf::actor primary = c.copy(1, ShardOptions::Start::kAwaitBackup);
  caf::actor client = c.client(0, 1);
  caf::scoped_actor self{*c.system};
  self->send(client, push_atom::value, pushOf(0, 7));  // sequence 7: told apart from the shard's index 0
  EXPECT_EQ(ackWithin(self, kQuiet), -1) << "a primary without its backup serves nothing";
  self->send(primary, replicate_atom::value, int64_t(2), shardCopyName(0), false);
  EXPECT_EQ(ackWithin(self, kTimeout), 0) << "replicate is answered with the shard";
  EXPECT_EQ(ackWithin(self, kQuiet), -1) << "applied by the primary, not by the backup: not acknowledged";
  // A worker's leave waits for the backup alike.
  self->send(primary, leave_atom::value, int64_t(0), int64_t(0));
  EXPECT_EQ(ackWithin(self, kQuiet), -1) << "the leave is not answered before the backup has it";
  int64_t detached = -1;
  self->request(primary, kTimeout, detach_atom::value)
      .receive([&](int64_t shard) { detached = shard; }, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  EXPECT_EQ(detached, 0);
  // Now both go out on the primary's word: the push's sequence (7) and the leave's worker (0).
  std::multiset<int64_t> answers = {ackWithin(self, kTimeout), ackWithin(self, kTimeout)};
  EXPECT_EQ(answers, (std::multiset<int64_t>{0, 7}));
  EXPECT_EQ(statsOf(self, primary).pushes, 1);
  EXPECT_FLOAT_EQ(moved(self, client), 1.0f);
}

// A backup that dies: the push waiting for it is acknowledged on the
// primary's word, the coordinator hears which shard lost its backup, and
// the primary serves on alone. Until then the two copies were the same.
TEST(Replica, ALostBackupIsDroppedAndTheCoordinatorHears) {
  Copies c(Consistency::kAsp, 1);
  caf::scoped_actor coord{*c.system};
  caf::actor backup = c.copy(2, ShardOptions::Start::kServe);
  caf::actor primary = c.copy(1, ShardOptions::Start::kAwaitBackup, caf::actor(coord));
  caf::actor client = c.client(0, 1);
  caf::actor backupReader = c.client(0, 2);
  caf::scoped_actor self{*c.system};
  self->request(primary, kTimeout, replicate_atom::value, int64_t(2), shardCopyName(0), false)
      .receive([](int64_t) {}, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  for (int64_t s = 0; s < 3; ++s) {
    self->send(client, push_atom::value, pushOf(0, s));
    EXPECT_EQ(ackWithin(self, kTimeout), s);
  }
  EXPECT_FLOAT_EQ(moved(self, client), 3.0f);
  EXPECT_FLOAT_EQ(moved(self, backupReader), 3.0f) << "the backup applied every acknowledged push";
  EXPECT_EQ(statsOf(self, backup).samples, 30);
  self->send_exit(backup, caf::exit_reason::kill);
  self->send(client, push_atom::value, pushOf(0, 3));
  EXPECT_EQ(ackWithin(self, kTimeout), 3);
  int64_t lost = -1;
  std::string why;
  coord->receive([&](backup_lost_atom, int64_t shard, const std::string& w) { lost = shard, why = w; },
                 caf::after(kTimeout) >> [] {});
  EXPECT_EQ(lost, 0);
  EXPECT_NE(why.find("did not answer"), std::string::npos) << why;
  EXPECT_FLOAT_EQ(moved(self, client), 4.0f);
  const Stats s = statsOf(self, primary);
  EXPECT_EQ(s.pushes, 4);
  EXPECT_EQ(s.samples, 40);
}

// A new backup is built by state transfer while a BSP step is half in (one
// worker's push held, not acknowledged): it takes the state and the held
// push, completes the step with the primary, and is then the same. Promoted,
// it answers re-sent pushes without applying them again.
TEST(Replica, ANewBackupIsBuiltByStateTransferAndTakesOverExactly) {
  Copies c(Consistency::kBsp, 2);
  caf::actor primary = c.copy(1, ShardOptions::Start::kServe);
  caf::actor w0 = c.client(0, 1), w1 = c.client(1, 1);
  caf::scoped_actor self{*c.system};
  for (int64_t s = 0; s < 3; ++s) {
    self->send(w0, push_atom::value, pushOf(0, s));
    self->send(w1, push_atom::value, pushOf(1, s));
    EXPECT_EQ(ackWithin(self, kTimeout), s);
    EXPECT_EQ(ackWithin(self, kTimeout), s);
  }
  self->send(w0, push_atom::value, pushOf(0, 3));
  EXPECT_EQ(ackWithin(self, kQuiet), -1) << "BSP holds worker 0's step 3 for worker 1's";
  caf::actor fresh = c.copy(2, ShardOptions::Start::kAwaitImage);
  // The backup catches up while training goes on: the held push reaches it
  // after the state, and replicate is answered (0) once the backup has
  // answered it too, which it does when worker 1's push completes step 3.
  self->send(primary, replicate_atom::value, int64_t(2), shardCopyName(0), true);
  self->send(w1, push_atom::value, pushOf(1, 3));
  std::multiset<int64_t> answers;
  for (int i = 0; i < 3; ++i) answers.insert(ackWithin(self, kTimeout));
  EXPECT_EQ(answers, (std::multiset<int64_t>{0, 3, 3})) << "replicate answered, and step 3 acknowledged to both";
  caf::actor reader = c.client(0, 2);
  EXPECT_FLOAT_EQ(moved(self, w0), 4.0f) << "BSP: one +1 per step (the pushes of a step averaged)";
  EXPECT_FLOAT_EQ(moved(self, reader), 4.0f) << "the new backup completed step 3 with the primary";
  const Stats p = statsOf(self, primary), b = statsOf(self, fresh);
  EXPECT_EQ(p.pushes, 4);
  EXPECT_EQ(b.pushes, 4);
  EXPECT_EQ(b.samples, 80);
  // The primary is lost: the backup serves, and what the workers send again
  // (their last pushes, acknowledged or not) is applied once.
  self->send_exit(primary, caf::exit_reason::kill);
  self->request(fresh, kTimeout, promote_atom::value).receive([](int64_t) {}, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  caf::actor w0b = c.client(0, 2), w1b = c.client(1, 2);
  self->send(w0b, push_atom::value, pushOf(0, 3));
  self->send(w1b, push_atom::value, pushOf(1, 3));
  EXPECT_EQ(ackWithin(self, kTimeout), 3);
  EXPECT_EQ(ackWithin(self, kTimeout), 3);
  self->send(w0b, push_atom::value, pushOf(0, 4));
  self->send(w1b, push_atom::value, pushOf(1, 4));
  EXPECT_EQ(ackWithin(self, kTimeout), 4);
  EXPECT_EQ(ackWithin(self, kTimeout), 4);
  EXPECT_FLOAT_EQ(moved(self, reader), 5.0f);
  const Stats after = statsOf(self, fresh);
  EXPECT_EQ(after.pushes, 5);
  EXPECT_EQ(after.duplicates, 2);
  EXPECT_EQ(after.samples, 100);
}

// While a new backup takes the state, training goes on: a push is
// answered on the primary's word, and goes to the backup after the state,
// in order; the job hears "two copies again" (replicate's answer) only once
// the backup has answered the state and every change sent after it. The
// backup here is a stand-in that shows what it gets.
TEST(Replica, WhileANewBackupTakesTheStateTrainingGoesOn) {
  Copies c(Consistency::kAsp, 1);
  caf::actor primary = c.copy(1, ShardOptions::Start::kServe);
  caf::scoped_actor fake{*c.system};
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.nodes[2] = caf::actor(fake);
  }
  caf::actor client = c.client(0, 1);
  caf::scoped_actor self{*c.system};
  self->send(primary, replicate_atom::value, int64_t(2), shardCopyName(0), true);
  self->send(client, push_atom::value, pushOf(0, 5));
  EXPECT_EQ(ackWithin(self, kTimeout), 5) << "answered on the primary's word while the backup takes the state";
  std::vector<std::string> got;
  fake->receive([&](install_atom, const transport::Tensor& bytes, int64_t) -> int64_t {
    got.push_back(fmt::format("install {} bytes", bytes.bytes > 0 ? "some" : "no"));
    return 0;
  }, caf::after(kTimeout) >> [&] { got.push_back("nothing"); });
  EXPECT_EQ(ackWithin(self, kQuiet), -1) << "not two copies before the backup answered the push sent after the state";
  fake->receive(
      [&](push_atom, int64_t worker, int64_t sequence, int64_t, int64_t, const transport::Tensor&,
          const transport::Tensor&, const transport::Tensor&, const transport::Tensor&, int64_t, double) -> int64_t {
        got.push_back(fmt::format("push {} of worker {}", sequence, worker));
        return sequence;
      },
      caf::after(kTimeout) >> [&] { got.push_back("nothing"); });
  EXPECT_EQ(got, (std::vector<std::string>{"install some bytes", "push 5 of worker 0"}));
  EXPECT_EQ(ackWithin(self, kTimeout), 0) << "replicate answered: two copies again";
  // From now on a push waits for the backup.
  self->send(client, push_atom::value, pushOf(0, 6));
  EXPECT_EQ(ackWithin(self, kQuiet), -1);
  fake->receive(
      [&](push_atom, int64_t, int64_t sequence, int64_t, int64_t, const transport::Tensor&, const transport::Tensor&,
          const transport::Tensor&, const transport::Tensor&, int64_t, double) -> int64_t { return sequence; },
      caf::after(kTimeout) >> [] { ADD_FAILURE() << "the push did not reach the backup"; });
  EXPECT_EQ(ackWithin(self, kTimeout), 6);
}

// Bytes that are no image are refused, naming what is wrong; the copy
// goes on waiting, and a real transfer then builds it.
TEST(Replica, ACorruptStateIsRefusedAndTheCopyWaitsForAGoodOne) {
  Copies c(Consistency::kAsp, 1);
  caf::actor primary = c.copy(1, ShardOptions::Start::kServe);
  caf::actor fresh = c.copy(2, ShardOptions::Start::kAwaitImage);
  caf::actor client = c.client(0, 1);
  caf::scoped_actor self{*c.system};
  self->send(client, push_atom::value, pushOf(0, 0));
  EXPECT_EQ(ackWithin(self, kTimeout), 0);
  std::vector<uint8_t> junk(200, 0x5a);
  std::string error;
  self->request(fresh, kTimeout, install_atom::value, transport::Tensor::adopt(junk, transport::DType::kBytes),
                int64_t(0))
      .receive([](int64_t) { ADD_FAILURE() << "junk taken as a shard's state"; },
               [&](caf::error& e) { error = caf::to_string(e); });
  EXPECT_NE(error.find("TRPSHRD1"), std::string::npos) << error;
  int64_t built = -1;
  self->request(primary, kTimeout, replicate_atom::value, int64_t(2), shardCopyName(0), true)
      .receive([&](int64_t shard) { built = shard; }, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  EXPECT_EQ(built, 0);
  EXPECT_FLOAT_EQ(moved(self, c.client(0, 2)), 1.0f);
}

// A change the two copies answer differently leaves them different: the
// backup is dropped and the coordinator told (it builds a new one). Here a
// new backup has the state but not the copy of the last step a hybrid
// group's undo needs (it is not part of the state sent): the primary
// undoes step 0, the backup cannot.
TEST(Replica, ACopyThatAnswersAChangeOtherwiseIsDropped) {
  Copies c(Consistency::kBsp, 2);
  caf::scoped_actor coord{*c.system};
  caf::actor primary = c.copy(1, ShardOptions::Start::kServe, caf::actor(coord), true);
  caf::actor w0 = c.client(0, 1), w1 = c.client(1, 1);
  caf::scoped_actor self{*c.system};
  self->send(w0, push_atom::value, pushOf(0, 0));
  self->send(w1, push_atom::value, pushOf(1, 0));
  EXPECT_EQ(ackWithin(self, kTimeout), 0);
  EXPECT_EQ(ackWithin(self, kTimeout), 0);
  c.copy(2, ShardOptions::Start::kAwaitImage, {}, true);
  self->request(primary, kTimeout, replicate_atom::value, int64_t(2), shardCopyName(0), true)
      .receive([](int64_t) {}, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  int64_t from = -1;
  self->request(primary, kTimeout, revert_atom::value, int64_t(1), int64_t(0), int64_t(1))
      .receive([&](int64_t f) { from = f; }, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  EXPECT_EQ(from, 0) << "the primary undid step 0";
  int64_t lost = -1;
  std::string why;
  coord->receive([&](backup_lost_atom, int64_t shard, const std::string& w) { lost = shard, why = w; },
                 caf::after(kTimeout) >> [] {});
  EXPECT_EQ(lost, 0);
  EXPECT_NE(why.find("it refused a change this copy took"), std::string::npos) << why;
  self->request(w0, kTimeout, generation_atom::value, int64_t(1)).receive([](int64_t) {}, [](caf::error&) {});
  EXPECT_FLOAT_EQ(moved(self, w0), 0.0f) << "step 0 undone";
}

// A worker's client whose shard went down waits for its new primary and
// sends there what was not answered; with no new primary named in time,
// the request fails saying so.
TEST(Replica, TheClientSendsAgainToTheNewPrimaryOrGivesUpInTime) {
  Copies c(Consistency::kAsp, 1);
  caf::scoped_actor coord{*c.system};  // asked where the primaries are; never answers
  caf::actor backup = c.copy(2, ShardOptions::Start::kServe);
  caf::actor primary = c.copy(1, ShardOptions::Start::kAwaitBackup);
  caf::actor client = c.client(0, 1, caf::actor(coord));
  caf::scoped_actor self{*c.system};
  self->send(primary, replicate_atom::value, int64_t(2), shardCopyName(0), false);
  EXPECT_EQ(ackWithin(self, kTimeout), 0);
  for (int64_t s = 0; s < 2; ++s) {
    self->send(client, push_atom::value, pushOf(0, s));
    EXPECT_EQ(ackWithin(self, kTimeout), s);
  }
  self->send_exit(primary, caf::exit_reason::kill);
  self->send(client, push_atom::value, pushOf(0, 2));
  EXPECT_EQ(ackWithin(self, kQuiet), -1) << "waits for the new primary";
  bool asked = false;
  coord->receive([&](routes_atom) { asked = true; }, caf::after(kTimeout) >> [] {});
  EXPECT_TRUE(asked) << "the client asks the coordinator where the primaries are";
  self->send(client, route_atom::value, std::vector<int64_t>{2});
  EXPECT_EQ(ackWithin(self, kTimeout), 2);
  EXPECT_FLOAT_EQ(moved(self, client), 3.0f);
  EXPECT_EQ(statsOf(self, backup).pushes, 3);

  // No new primary: the push fails within the client's bound.
  caf::actor lonely = c.client(0, 2, caf::actor(coord), std::chrono::seconds(1));
  self->send_exit(backup, caf::exit_reason::kill);
  std::string error;
  self->request(lonely, kTimeout, push_atom::value, pushOf(0, 3))
      .receive([](int64_t) { ADD_FAILURE() << "acknowledged by a dead shard"; },
               [&](caf::error& e) { error = caf::to_string(e); });
  EXPECT_NE(error.find("no new primary was named within 1 s"), std::string::npos) << error;
}

}  // namespace
}  // namespace troupe::ps
