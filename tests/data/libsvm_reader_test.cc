#include "data/libsvm_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/common/temp_dir.h"

namespace troupe::data {
namespace {

using ::testing::HasSubstr;
using troupe::testing::TempDir;
using troupe::testing::writeFile;

LibsvmBatch readAll(const LibsvmReaderOptions& options, size_t batchRows) {
  auto reader = LibsvmReader::open(options);
  EXPECT_TRUE(reader.hasValue()) << (reader ? "" : reader.status().toString());
  LibsvmBatch all, batch;
  if (!reader) return all;
  for (;;) {
    auto n = (*reader)->next(batchRows, &batch);
    EXPECT_TRUE(n.hasValue()) << (n ? "" : n.status().toString());
    if (!n || *n == 0) break;
    EXPECT_LE(*n, batchRows);
    EXPECT_EQ(batch.rowOffsets.size(), batch.rows() + 1);
    EXPECT_EQ(size_t(batch.rowOffsets.back()), batch.entries());
    for (size_t r = 0; r < batch.rows(); ++r) {
      all.labels.push_back(batch.labels[r]);
      for (int64_t e = batch.rowOffsets[r]; e < batch.rowOffsets[r + 1]; ++e) {
        all.indices.push_back(batch.indices[size_t(e)]);
        all.values.push_back(batch.values[size_t(e)]);
      }
      all.rowOffsets.push_back(int64_t(all.indices.size()));
    }
  }
  return all;
}

std::string firstError(const std::string& path) {
  LibsvmReaderOptions options;
  options.path = path;
  auto reader = LibsvmReader::open(options);
  if (!reader) return reader.status().message();
  LibsvmBatch batch;
  for (;;) {
    auto n = (*reader)->next(100, &batch);
    if (!n) return n.status().message();
    if (*n == 0) return "";
  }
}

constexpr const char* kFile =
    "1 3:0.5 1:2 10:-1.25\n"
    "-1 2:1e-3\r\n"
    "+1\n"
    "\n"
    "# a comment line\n"
    "0.75 7:1 # trailing comment\n"
    "0\t4:2\t5:3";

TEST(LibsvmReader, ParsesRowsIntoCsr) {
  TempDir dir;
  const std::string path = dir.file("a.svm");
  writeFile(path, kFile);
  LibsvmReaderOptions options;
  options.path = path;
  const LibsvmBatch b = readAll(options, 100);
  EXPECT_EQ(b.labels, (std::vector<float>{1, -1, 1, 0.75f, 0}));
  EXPECT_EQ(b.rowOffsets, (std::vector<int64_t>{0, 3, 4, 4, 5, 7}));
  EXPECT_EQ(b.indices, (std::vector<uint64_t>{3, 1, 10, 2, 7, 4, 5}));  // order kept
  EXPECT_EQ(b.values, (std::vector<float>{0.5f, 2, -1.25f, 1e-3f, 1, 2, 3}));
}

class LibsvmBatchSize : public ::testing::TestWithParam<size_t> {};

TEST_P(LibsvmBatchSize, BatchesConcatenateToTheWholeFile) {
  TempDir dir;
  const std::string path = dir.file("a.svm");
  writeFile(path, kFile);
  LibsvmReaderOptions options;
  options.path = path;
  const LibsvmBatch whole = readAll(options, 1000);
  const LibsvmBatch b = readAll(options, GetParam());
  EXPECT_EQ(b.labels, whole.labels);
  EXPECT_EQ(b.rowOffsets, whole.rowOffsets);
  EXPECT_EQ(b.indices, whole.indices);
  EXPECT_EQ(b.values, whole.values);
}

INSTANTIATE_TEST_SUITE_P(Sizes, LibsvmBatchSize, ::testing::Values(1, 3, 5, 100));

TEST(LibsvmReader, BinaryLabels) {
  TempDir dir;
  const std::string path = dir.file("b.svm");
  writeFile(path, "+1 1:1\n-1 1:1\n0 1:1\n1 1:1\n");
  LibsvmReaderOptions options;
  options.path = path;
  options.labels = LibsvmLabels::kBinary;
  EXPECT_EQ(readAll(options, 10).labels, (std::vector<float>{1, 0, 0, 1}));
  writeFile(path, "1 1:1\n0.5 1:1\n");
  auto reader = LibsvmReader::open(options);
  LibsvmBatch batch;
  auto n = (*reader)->next(10, &batch);
  ASSERT_FALSE(n.hasValue());
  EXPECT_THAT(n.status().message(), HasSubstr(path + ":2: binary label must be 0, 1, -1 or +1, token '0.5'"));
}

TEST(LibsvmReader, ErrorsNameFileLineAndToken) {
  TempDir dir;
  const std::string path = dir.file("bad.svm");
  writeFile(path, "1 1:1\nyes 1:1\n");
  EXPECT_THAT(firstError(path), HasSubstr(path + ":2: label is not a number, token 'yes'"));
  writeFile(path, "1 1:1\n1 2:1\n0 3\n");
  EXPECT_THAT(firstError(path), HasSubstr(path + ":3: feature is not idx:value, token '3'"));
  writeFile(path, "1 -4:1\n");
  EXPECT_THAT(firstError(path), HasSubstr(path + ":1: feature index is not a non-negative integer, token '-4:1'"));
  writeFile(path, "1 4:abc\n");
  EXPECT_THAT(firstError(path), HasSubstr(path + ":1: feature value is not a finite number, token '4:abc'"));
  writeFile(path, "1 4:\n");
  EXPECT_THAT(firstError(path), HasSubstr("token '4:'"));
  EXPECT_THAT(firstError(dir.file("missing.svm")), HasSubstr("No such file or directory"));
}

TEST(LibsvmReader, SkipBadLinesCountsAndKeepsGoodRows) {
  TempDir dir;
  const std::string path = dir.file("mixed.svm");
  writeFile(path, "1 1:1 2:2\nx 1:1\n0 5:5\n1 1:1 2:oops\n1 9:9");
  LibsvmReaderOptions options;
  options.path = path;
  options.skipBadLines = true;
  auto reader = LibsvmReader::open(options);
  ASSERT_TRUE(reader.hasValue());
  LibsvmBatch batch;
  auto n = (*reader)->next(100, &batch);
  ASSERT_TRUE(n.hasValue());
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ((*reader)->badLines(), 2);
  EXPECT_EQ(batch.labels, (std::vector<float>{1, 0, 1}));
  // The half-parsed bad row left nothing behind.
  EXPECT_EQ(batch.rowOffsets, (std::vector<int64_t>{0, 2, 3, 4}));
  EXPECT_EQ(batch.indices, (std::vector<uint64_t>{1, 2, 5, 9}));
}

}  // namespace
}  // namespace troupe::data
