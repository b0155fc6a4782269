// The model file of a sync-mode checkpoint (workers/model_image.h) and its
// place in the manifest (workers/checkpoint.h): what is written comes back
// whole; a file that is truncated, corrupt, of another kind or of another
// model, and a manifest that lists no model file for a sync job (or one for
// a ps job), are refused, naming the file and what is wrong.
#include "workers/model_image.h"

#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>

#include "common/checksum_file.h"
#include "tests/common/temp_dir.h"
#include "workers/checkpoint.h"

namespace troupe::workers {
namespace {

using testing::TempDir;

ModelImage sample() {
  ModelImage m;
  m.workers = 3;
  m.step = 250;
  m.epoch = 1;
  m.epochBatch = 17;
  m.samplesApplied = 96000;
  m.denseParameters = 4;
  m.dense = {0.5f, -1.25f, 3.0f, 7.5f, 0.01f, 0.02f, 0.03f, 0.04f};  // 4 weights, then their optimizer state
  ps::TableImage t;
  t.tableId = 2;
  t.dim = 2;
  t.rowFloats = 4;
  t.optimizerKind = 1;
  t.keys = {11, 99};
  t.rows = {1, 2, 3, 4, 5, 6, 7, 8};
  m.tables = std::make_shared<const std::vector<ps::TableImage>>(std::vector<ps::TableImage>{t});
  return m;
}

TEST(ModelImageTest, WhatIsWrittenComesBackWhole) {
  TempDir dir;
  const ModelImage m = sample();
  uint64_t checksum = 0, bytes = 0;
  ASSERT_TRUE(writeModelImage(m, dir.file("model.ckpt"), &checksum, &bytes).isOk());
  const std::string content = testing::readFile(dir.file("model.ckpt"));
  ASSERT_GE(content.size(), 16u);
  EXPECT_EQ(bytes, content.size());
  uint64_t trailer = 0;
  std::memcpy(&trailer, content.data() + content.size() - 8, 8);
  EXPECT_EQ(checksum, trailer);
  EXPECT_EQ(trailer, xxh3(content.data(), content.size() - 8));
  auto r = readModelImage(dir.file("model.ckpt"));
  ASSERT_TRUE(r.hasValue()) << r.status().message();
  EXPECT_EQ(r->workers, 3);
  EXPECT_EQ(r->step, 250);
  EXPECT_EQ(r->epoch, 1);
  EXPECT_EQ(r->epochBatch, 17);
  EXPECT_EQ(r->samplesApplied, 96000);
  EXPECT_EQ(r->denseParameters, 4);
  EXPECT_EQ(r->dense, m.dense);
  ASSERT_EQ(r->tableCount(), 1u);
  EXPECT_EQ((*r->tables)[0].tableId, 2);
  EXPECT_EQ((*r->tables)[0].keys, (std::vector<uint64_t>{11, 99}));
  EXPECT_EQ((*r->tables)[0].rows, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_TRUE(checkModelImage(*r, "x", 3, 4, 8, 1).isOk());
}

TEST(ModelImageTest, BrokenForeignOrMismatchedFilesAreRefusedNamingFileAndProblem) {
  TempDir dir;
  ASSERT_TRUE(writeModelImage(sample(), dir.file("model.ckpt")).isOk());
  const std::string bytes = testing::readFile(dir.file("model.ckpt"));
  ASSERT_GE(bytes.size(), 64u);
  auto write = [&](const std::string& name, const std::string& content) {
    testing::writeFile(dir.file(name), content);
    return dir.file(name);
  };
  auto refused = [&](const std::string& path, const std::string& needle) {
    auto r = readModelImage(path);
    ASSERT_FALSE(r.hasValue()) << path;
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  refused(write("truncated", bytes.substr(0, bytes.size() - 20)), "checksum mismatch");
  refused(write("tiny", bytes.substr(0, 10)), "truncated");
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x04;
  refused(write("flipped", flipped), "checksum mismatch");
  std::string magic = bytes;
  magic[4] = 'X';
  refused(write("magic", magic), "not a TRPMODL1 file");
  refused(dir.file("missing"), "cannot open");
  // A well-formed file whose header makes no sense: a negative place in the epoch.
  ModelImage odd = sample();
  odd.epochBatch = -5;
  ASSERT_TRUE(writeModelImage(odd, dir.file("odd.ckpt")).isOk());
  refused(dir.file("odd.ckpt"), "(epoch 1, from its batch -5)");
  // Whole, but of another job.
  auto img = readModelImage(dir.file("model.ckpt"));
  ASSERT_TRUE(img.hasValue());
  auto differs = [&](int64_t workers, int64_t weights, int64_t floats, int64_t tables, const std::string& needle) {
    Status s = checkModelImage(*img, "the/model.ckpt", workers, weights, floats, tables);
    EXPECT_FALSE(s.isOk()) << needle;
    EXPECT_NE(s.message().find("the/model.ckpt: holds " + needle), std::string::npos) << s.message();
  };
  differs(2, 4, 8, 1, "3 workers; this job has 2");
  differs(3, 5, 10, 1, "4 dense weights; this job has 5");
  differs(3, 4, 12, 1, "8 floats of dense state (weights and optimizer); this job has 12");
  differs(3, 4, 8, 0, "1 embedding tables; this job has 0");
}

// The manifest of a sync job lists its model file; a ps job's lists none.
TEST(ModelImageTest, TheManifestListsTheModelFileOfASyncJobAndOnlyThen) {
  TempDir dir;
  CheckpointManifest m;
  m.id = 4;
  m.created = "2026-11-23T00:00:00Z";
  m.shape.mode = "allreduce";
  m.shape.model = "dlrm";
  m.shape.consistency = "bsp";
  m.shape.workers = 3;
  m.shape.servers = 0;
  m.shape.tableDims = {16};
  m.shape.denseParameters = 4;
  m.shape.embeddingOptimizer = "adagrad";
  m.shape.denseOptimizer = "adam";
  m.workerSteps = {250, 250, 250};
  m.config = CheckpointFile{"config.toml", 3, 0x1234};
  m.models = {CheckpointFile{"model.ckpt", 99, 0xabcdef0123456789ULL}};
  m.cutEpoch = 1;
  m.cutBatch = 44;
  m.divisions = {{0, 0, 3}, {0, 126, 2}};
  const std::string ckpt = checkpointDir(dir.path(), 4);
  std::filesystem::create_directories(ckpt);
  ASSERT_TRUE(writeManifest(ckpt, m).isOk());
  auto r = readManifest(ckpt);
  ASSERT_TRUE(r.hasValue()) << r.status().message();
  ASSERT_EQ(r->models.size(), 1u);
  EXPECT_EQ(r->models[0].file, "model.ckpt");
  EXPECT_EQ(r->models[0].bytes, 99u);
  EXPECT_EQ(r->models[0].checksum, 0xabcdef0123456789ULL);
  EXPECT_TRUE(r->shards.empty());
  EXPECT_EQ(r->cutEpoch, 1);
  EXPECT_EQ(r->cutBatch, 44);
  ASSERT_EQ(r->divisions.size(), 2u);
  EXPECT_EQ(r->divisions[1].epoch, 0);
  EXPECT_EQ(r->divisions[1].fromBatch, 126);
  EXPECT_EQ(r->divisions[1].parts, 2);
  // The model file is verified like every other.
  Status whole = verifyCheckpoint(ckpt, *r);
  EXPECT_FALSE(whole.isOk());
  EXPECT_NE(whole.message().find(ckpt + "/model.ckpt: missing"), std::string::npos) << whole.message();
  testing::writeFile(ckpt + "/model.ckpt", "not 99 bytes");
  whole = verifyCheckpoint(ckpt, *r);
  EXPECT_NE(whole.message().find(ckpt + "/model.ckpt: 12 bytes, the manifest says 99"), std::string::npos)
      << whole.message();

  // Divisions that do not follow from the job and the cut.
  for (const std::vector<DataDivision>& bad :
       {std::vector<DataDivision>{{0, 0, 2}}, std::vector<DataDivision>{{0, 0, 3}, {0, 126, 4}},
        std::vector<DataDivision>{{0, 0, 3}, {0, 126, 2}, {0, 100, 2}}, std::vector<DataDivision>{{0, 0, 3}, {1, 50, 2}}}) {
    CheckpointManifest odd = m;
    odd.divisions = bad;
    ASSERT_TRUE(writeManifest(ckpt, odd).isOk());
    r = readManifest(ckpt);
    ASSERT_FALSE(r.hasValue()) << bad.size();
    EXPECT_NE(r.status().message().find("'divisions' entry"), std::string::npos) << r.status().message();
  }
  {
    ASSERT_TRUE(writeManifest(ckpt, m).isOk());
    std::string text = testing::readFile(ckpt + "/manifest.toml");
    ASSERT_NE(text.find("divisions = ["), std::string::npos);
  }

  // A sync job without its model file, a ps job with one.
  m.models.clear();
  ASSERT_TRUE(writeManifest(ckpt, m).isOk());
  r = readManifest(ckpt);
  ASSERT_FALSE(r.hasValue());
  EXPECT_NE(r.status().message().find("0 model files for a job in allreduce mode (it takes 1)"), std::string::npos)
      << r.status().message();
  m.shape.mode = "ps";
  m.shape.servers = 1;
  m.shards = {CheckpointFile{"shard-0.ckpt", 10, 1}};
  m.samplesApplied = {0};
  m.models = {CheckpointFile{"model.ckpt", 99, 1}};
  ASSERT_TRUE(writeManifest(ckpt, m).isOk());
  r = readManifest(ckpt);
  ASSERT_FALSE(r.hasValue());
  EXPECT_NE(r.status().message().find("1 model files for a job in ps mode (it takes 0)"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace troupe::workers
