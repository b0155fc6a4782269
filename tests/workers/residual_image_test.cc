// The codecs' residuals of a checkpoint (workers/residual_image.h): what is
// written comes back whole; a file that is truncated, corrupt or of another
// worker, step or job is refused, naming the file and what is wrong; and
// the all-reduce's residuals go back only with lengths that fit their
// tensor. Expected values are the ones written.
#include "workers/residual_image.h"

#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include "collectives/compressed_allreduce.h"
#include "common/checksum_file.h"
#include "tests/common/temp_dir.h"

namespace troupe::workers {
namespace {

using testing::TempDir;

ResidualImage sample() {
  ResidualImage img;
  img.worker = 1;
  img.step = 120;
  img.pushCodec = uint8_t(kernels::CodecKind::kInt8);
  img.allreduceCodec = uint8_t(kernels::CodecKind::kOneBit);
  img.pushDense = {{0.5f, -0.25f, 1e-7f}, {}};  // shard 1 had no dense residual yet
  img.pushRows.resize(2);
  img.pushRows[0].keys = {7, 3};
  img.pushRows[0].values = {1, 2, 3, 4};  // dim 2
  img.pushRows[1].keys = {42};
  img.pushRows[1].values = {-1, -2, -3};  // dim 3
  collectives::TensorResiduals t;
  t.key = 4;
  t.count = 5;
  t.size = 2;
  t.rank = 1;
  t.residual = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  t.owned = {9, 8, 7};  // rank 1 of 2 owns values 2..5
  img.allreduce = {t};
  return img;
}

TEST(ResidualImage, WhatIsWrittenComesBackWhole) {
  TempDir dir;
  const std::string path = dir.file(residualFileName(1));
  EXPECT_EQ(residualFileName(1), "residuals-1.ckpt");
  uint64_t checksum = 0, bytes = 0;
  ASSERT_TRUE(writeResidualImage(sample(), path, &checksum, &bytes).isOk());
  EXPECT_EQ(bytes, std::filesystem::file_size(path));
  EXPECT_NE(checksum, 0u);
  auto got = readResidualImage(path);
  ASSERT_TRUE(got.hasValue()) << got.status().message();
  const ResidualImage want = sample();
  EXPECT_EQ(got->worker, 1);
  EXPECT_EQ(got->step, 120);
  EXPECT_EQ(got->pushCodec, uint8_t(kernels::CodecKind::kInt8));
  EXPECT_EQ(got->allreduceCodec, uint8_t(kernels::CodecKind::kOneBit));
  EXPECT_EQ(got->pushDense, want.pushDense);
  ASSERT_EQ(got->pushRows.size(), 2u);
  EXPECT_EQ(got->pushRows[0].keys, want.pushRows[0].keys);
  EXPECT_EQ(got->pushRows[1].values, want.pushRows[1].values);
  ASSERT_EQ(got->allreduce.size(), 1u);
  EXPECT_EQ(got->allreduce[0].key, 4);
  EXPECT_EQ(got->allreduce[0].count, 5);
  EXPECT_EQ(got->allreduce[0].rank, 1);
  EXPECT_EQ(got->allreduce[0].residual, want.allreduce[0].residual);
  EXPECT_EQ(got->allreduce[0].owned, want.allreduce[0].owned);
  EXPECT_TRUE(checkResidualImage(*got, path, 1, 120, {2, 3}, {3, 2}).isOk());
}

TEST(ResidualImage, BrokenOrForeignFilesAreRefusedNamingThem) {
  TempDir dir;
  const std::string path = dir.file("r.ckpt");
  ASSERT_TRUE(writeResidualImage(sample(), path).isOk());
  const auto size = std::filesystem::file_size(path);
  // Truncated, and one byte changed: the checksum.
  std::filesystem::copy_file(path, dir.file("short.ckpt"));
  std::filesystem::resize_file(dir.file("short.ckpt"), size - 9);
  auto r = readResidualImage(dir.file("short.ckpt"));
  ASSERT_FALSE(r.hasValue());
  EXPECT_NE(r.status().message().find(dir.file("short.ckpt")), std::string::npos) << r.status().message();
  std::filesystem::copy_file(path, dir.file("flip.ckpt"));
  {
    std::FILE* f = std::fopen(dir.file("flip.ckpt").c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 30, SEEK_SET);
    std::fputc('Z', f);
    std::fclose(f);
  }
  r = readResidualImage(dir.file("flip.ckpt"));
  ASSERT_FALSE(r.hasValue());
  EXPECT_NE(r.status().message().find("checksum mismatch"), std::string::npos) << r.status().message();
  // Whole and checksummed but claiming more parts than it holds: refused
  // before anything that size is allocated; and an unknown codec.
  for (uint64_t parts : {uint64_t{1} << 40, uint64_t{1000}}) {
    auto w = ChecksumWriter::create(dir.file("huge.ckpt"), kResidualImageMagic);
    ASSERT_TRUE(w.hasValue());
    w->put(uint32_t{1});
    w->put(int64_t{0});
    w->put(int64_t{5});
    w->put(uint8_t{0});
    w->put(uint8_t{0});
    w->put(parts);
    ASSERT_TRUE(w->finish().isOk());
    r = readResidualImage(dir.file("huge.ckpt"));
    ASSERT_FALSE(r.hasValue());
    EXPECT_NE(r.status().message().find("more than the file holds"), std::string::npos) << r.status().message();
  }
  {
    auto w = ChecksumWriter::create(dir.file("codec.ckpt"), kResidualImageMagic);
    ASSERT_TRUE(w.hasValue());
    w->put(uint32_t{1});
    w->put(int64_t{0});
    w->put(int64_t{5});
    w->put(uint8_t{9});
    w->put(uint8_t{0});
    ASSERT_TRUE(w->finish().isOk());
    r = readResidualImage(dir.file("codec.ckpt"));
    ASSERT_FALSE(r.hasValue());
    EXPECT_NE(r.status().message().find("codecs 9 and 0"), std::string::npos) << r.status().message();
  }
  // Of another worker, step, table layout or shard slicing.
  const ResidualImage img = sample();
  auto refused = [&](Status s, const std::string& needle) {
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.message();
    EXPECT_NE(s.message().find(path + ": " + needle), std::string::npos) << s.message();
  };
  refused(checkResidualImage(img, path, 0, 120, {2, 3}, {3, 2}), "holds worker 1's residuals, not worker 0's");
  refused(checkResidualImage(img, path, 1, 160, {2, 3}, {3, 2}), "holds the residuals of step 120; the worker resumes at 160");
  refused(checkResidualImage(img, path, 1, 120, {2, 4}, {3, 2}), "holds 3 residual floats for 1 keys of table 1 (dim 4)");
  refused(checkResidualImage(img, path, 1, 120, {2}, {3, 2}), "holds residual rows of 2 tables; this job has 1");
  refused(checkResidualImage(img, path, 1, 120, {2, 3}, {4, 2}), "holds 3 dense residuals for shard 0, whose slice is 4");
  refused(checkResidualImage(img, path, 1, 120, {2, 3}, {3, 2, 1}), "holds dense residuals for 2 shards; this job has 3");
  ResidualImage twice = img;
  twice.pushRows[0].keys = {7, 7};
  refused(checkResidualImage(twice, path, 1, 120, {2, 3}, {3, 2}), "holds a key of table 0 twice");
}

TEST(ResidualImage, AllReduceResidualsGoBackOnlyWhereTheyFit) {
  kernels::CodecOptions o;
  o.kind = kernels::CodecKind::kInt8;
  collectives::CompressedAllReduce reducer(o, 0);
  const ResidualImage img = sample();
  ASSERT_TRUE(reducer.restoreResiduals(img.allreduce).isOk());
  EXPECT_EQ(reducer.residuals(4), img.allreduce[0].residual);
  EXPECT_EQ(reducer.ownerResiduals(4), img.allreduce[0].owned);
  const auto saved = reducer.saveResiduals();
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved[0].residual, img.allreduce[0].residual);
  auto bad = img.allreduce;
  bad[0].owned.push_back(1.0f);  // rank 1 of 2 owns 3 of 5 values, not 4
  Status s = reducer.restoreResiduals(bad);
  EXPECT_EQ(s.code(), Status::Code::kCorruption) << s.message();
  EXPECT_NE(s.message().find("tensor 4"), std::string::npos) << s.message();
  bad = img.allreduce;
  bad[0].rank = 2;  // no rank 2 of 2
  EXPECT_EQ(reducer.restoreResiduals(bad).code(), Status::Code::kCorruption);
  bad = img.allreduce;
  bad[0].count = INT64_MAX;  // a count the floats read do not back: refused before it is multiplied
  EXPECT_EQ(reducer.restoreResiduals(bad).code(), Status::Code::kCorruption);
  bad = {img.allreduce[0], img.allreduce[0]};  // one tensor twice
  EXPECT_EQ(reducer.restoreResiduals(bad).code(), Status::Code::kCorruption);
  EXPECT_EQ(reducer.residuals(4), img.allreduce[0].residual) << "a refused restore changes nothing";
}

}  // namespace
}  // namespace troupe::workers
