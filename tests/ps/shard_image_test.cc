// A shard's checkpoint: the state a snapshot copies comes back whole in a
// shard restored from its file (rows with optimizer state, dense slice,
// which pushes were applied, the ledger), and a file that is truncated,
// corrupt, of another kind or of another model is refused, naming the file
// and what is wrong.
#include "ps/shard_image.h"

#include <filesystem>
#include <fstream>

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include "ps/messages.h"
#include "ps/shard.h"
#include "ps/wire.h"
#include "tests/common/temp_dir.h"
#include "workers/ps_client.h"

namespace troupe::ps {
namespace {

using namespace std::chrono_literals;
using testing::TempDir;
using transport::DType;
using transport::Tensor;

ShardOptions options(std::shared_ptr<const ShardImage> restore = nullptr) {
  ShardOptions o;
  o.shard = 0;
  o.shards = 1;
  o.workers = 2;
  for (int t = 0; t < 2; ++t) {
    EmbeddingTableOptions table;
    table.tableId = t;
    table.dim = t == 0 ? 4 : 3;
    table.seed = 9;
    table.optimizer.kind = kernels::OptimizerKind::kAdagrad;
    table.optimizer.learningRate = 0.5f;
    o.tables.push_back(table);
  }
  o.denseInit = {1, 2, 3, 4, 5};
  o.denseOptimizer.kind = kernels::OptimizerKind::kAdam;
  o.denseOptimizer.learningRate = 0.1f;
  o.consistency = Consistency::kAsp;
  o.restore = std::move(restore);
  return o;
}

Tensor u64(std::vector<uint64_t> v) { return Tensor::adopt(std::move(v), DType::kUInt64); }
Tensor f32(std::vector<float> v) { return Tensor::adopt(std::move(v), DType::kFloat32); }

struct Reply {
  std::vector<float> rows, dense;
};

Reply pull(caf::scoped_actor& self, const caf::actor& shard) {
  Reply r;
  self->request(shard, 10s, pullToWire(0, 0, false, true, u64({3, 2}), u64({1, 2, 77, 5, 6})))
      .receive(
          [&](const Tensor& rows, const Tensor& dense) {
            r.rows.assign(rows.as<float>(), rows.as<float>() + rows.count<float>());
            r.dense.assign(dense.as<float>(), dense.as<float>() + dense.count<float>());
          },
          [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  return r;
}

int64_t clockOf(caf::scoped_actor& self, const caf::actor& shard, int64_t w) {
  int64_t c = -1;
  self->request(shard, 10s, clock_atom::value, w).receive([&](int64_t x) { c = x; }, [](caf::error&) {});
  return c;
}

class ShardImageTest : public ::testing::Test {
 protected:
  // A shard that has applied 3 pushes of worker 0 (sequences 0, 1, 3) and
  // 1 of worker 1, checkpointed to `path_`.
  void SetUp() override {
    system_ = std::make_unique<caf::actor_system>(cfg_);
    caf::scoped_actor self{*system_};
    auto shard = spawnShard(*system_, options());
    for (auto [w, seq] : {std::pair{0, 0}, {0, 1}, {0, 3}, {1, 0}}) {
      std::vector<float> grads(3 * 4 + 2 * 3);
      for (size_t i = 0; i < grads.size(); ++i) grads[i] = float(i + seq) * 0.1f;
      self->request(shard, 10s,
                    pushToWire(w, seq, seq, 8, u64({3, 2}), u64({1, 2, 3, 5, 6}), f32(grads), f32({1, -1, 2, 0, 3})))
          .receive([](int64_t) {}, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
    }
    before_ = pull(self, shard);
    path_ = dir_.file("shard-0.ckpt");
    std::vector<int64_t> floors;
    self->request(shard, 10s, snapshot_atom::value, int64_t{7}, path_)
        .receive([&](int64_t id, std::vector<int64_t>& f, int64_t samples) {
                   floors = f;
                   EXPECT_EQ(samples, 4 * 8);
                 },
                 [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
    EXPECT_EQ(floors, (std::vector<int64_t>{2, 1})) << "worker 0 applied 0, 1 (and 3 early)";
    self->receive(
        [&](written_atom, int64_t id, int64_t s, const std::string& p, uint64_t bytes, uint64_t checksum,
            const std::string& error) {
          EXPECT_EQ(id, 7);
          EXPECT_EQ(p, path_);
          EXPECT_EQ(error, "");
          EXPECT_GT(bytes, 100u);
          checksum_ = checksum;
        },
        caf::after(10s) >> [] { ADD_FAILURE() << "the checkpoint was not written"; });
    self->send_exit(shard, caf::exit_reason::user_shutdown);
  }

  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> system_;
  TempDir dir_;
  std::string path_;
  uint64_t checksum_ = 0;
  Reply before_;
};

TEST_F(ShardImageTest, ARestoredShardGoesOnFromTheCut) {
  auto img = readShardImage(path_);
  ASSERT_TRUE(img.hasValue()) << img.status().message();
  EXPECT_EQ(img->samplesApplied, 4 * 8);
  EXPECT_EQ(img->pushesApplied, 4);
  caf::scoped_actor self{*system_};
  auto restored = spawnShard(*system_, options(std::make_shared<ShardImage>(std::move(*img))));
  const Reply after = pull(self, restored);
  EXPECT_EQ(after.rows, before_.rows) << "rows and their optimizer go on from the cut";
  EXPECT_EQ(after.dense, before_.dense);
  EXPECT_EQ(clockOf(self, restored, 0), 2) << "worker 0 resumes at its first unapplied push";
  EXPECT_EQ(clockOf(self, restored, 1), 1);
  // The push applied early (3) is still known: re-sent, it is a duplicate.
  int64_t dups = -1, samples = -1;
  self->request(restored, 10s, pushToWire(0, 3, 3, 8, u64({0, 0}), u64({}), f32({}), f32({})))
      .receive([](int64_t) {}, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  self->request(restored, 10s, stats_atom::value)
      .receive([&](int64_t, int64_t, int64_t d, int64_t, int64_t, int64_t, int64_t s, const std::vector<int64_t>&) { dups = d, samples = s; },
               [](caf::error&) {});
  EXPECT_EQ(dups, 1);
  EXPECT_EQ(samples, 4 * 8) << "the ledger goes on from the cut";
  // Optimizer state and all: the restored shard's own checkpoint holds the
  // same row blocks and dense slice.
  const std::string again = dir_.file("again.ckpt");
  self->request(restored, 10s, snapshot_atom::value, int64_t{8}, again)
      .receive([](int64_t, std::vector<int64_t>&, int64_t) {}, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  self->receive([](written_atom, int64_t, int64_t, const std::string&, uint64_t, uint64_t, const std::string& error) {
    EXPECT_EQ(error, "");
  }, caf::after(10s) >> [] { ADD_FAILURE() << "not written"; });
  auto first = readShardImage(path_), second = readShardImage(again);
  ASSERT_TRUE(first.hasValue() && second.hasValue());
  ASSERT_EQ(first->tables.size(), second->tables.size());
  for (size_t t = 0; t < first->tables.size(); ++t) {
    EXPECT_EQ(first->tables[t].keys, second->tables[t].keys) << t;
    EXPECT_EQ(first->tables[t].rows, second->tables[t].rows) << t;
  }
  EXPECT_EQ(first->dense, second->dense);
  EXPECT_EQ(first->updates, second->updates);
  self->send_exit(restored, caf::exit_reason::user_shutdown);
}

TEST_F(ShardImageTest, BrokenOrForeignFilesAreRefusedNamingFileAndProblem) {
  std::string bytes;
  {
    std::ifstream in(path_, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir_.file(name), std::ios::binary) << content;
    return dir_.file(name);
  };
  auto refused = [&](const std::string& path, const std::string& needle) {
    auto r = readShardImage(path);
    ASSERT_FALSE(r.hasValue());
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  refused(write("truncated", bytes.substr(0, bytes.size() / 2)), "checksum mismatch");
  refused(write("tiny", bytes.substr(0, 10)), "truncated");
  std::string flipped = bytes;
  flipped[bytes.size() / 3] ^= 0x10;
  refused(write("flipped", flipped), "checksum mismatch");
  std::string magic = bytes;
  magic[3] = 'X';
  refused(write("magic", magic), "not a TRPSHRD1 file");
  refused(dir_.file("missing"), "cannot open");
  // Whole, but of another model: the table's dim differs.
  auto img = readShardImage(path_);
  ASSERT_TRUE(img.hasValue());
  ShardOptions other = options();
  other.tables[1].dim = 5;
  Status s = checkShardImage(*img, other);
  EXPECT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("its table 1 has dim 3"), std::string::npos) << s.message();
  other = options();
  other.shards = 2;
  EXPECT_NE(checkShardImage(*img, other).message().find("it holds shard 0 of 1; this is shard 0 of 2"),
            std::string::npos);
  other = options();
  other.restore = std::make_shared<ShardImage>(*img);
  other.tables[0].optimizer.kind = kernels::OptimizerKind::kSgd;
  EXPECT_THROW(spawnShard(*system_, other), SetupError);
}

}  // namespace
}  // namespace troupe::ps
