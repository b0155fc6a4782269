#include "data/idx_reader.h"

#include <zlib.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"

namespace troupe::data {
namespace {

using ::testing::HasSubstr;
using troupe::testing::TempDir;

void putBigEndian(std::vector<uint8_t>* out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out->push_back(uint8_t(v >> s));
}

std::vector<uint8_t> imagesBytes(uint32_t count, uint32_t rows, uint32_t cols) {
  std::vector<uint8_t> b;
  putBigEndian(&b, kIdxImagesMagic);
  putBigEndian(&b, count);
  putBigEndian(&b, rows);
  putBigEndian(&b, cols);
  for (uint32_t i = 0; i < count * rows * cols; ++i) b.push_back(uint8_t(i * 37 % 256));
  return b;
}

std::vector<uint8_t> labelsBytes(uint32_t count) {
  std::vector<uint8_t> b;
  putBigEndian(&b, kIdxLabelsMagic);
  putBigEndian(&b, count);
  for (uint32_t i = 0; i < count; ++i) b.push_back(uint8_t(i % 10));
  return b;
}

void writeGzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

void writePlain(const std::string& path, const std::vector<uint8_t>& bytes) {
  troupe::testing::writeFile(path, std::string(bytes.begin(), bytes.end()));
}

TEST(IdxReader, GzipRoundTrip) {
  TempDir dir;
  writeGzip(dir.file("img.gz"), imagesBytes(5, 3, 2));
  writeGzip(dir.file("lab.gz"), labelsBytes(5));
  auto d = readIdxDataset(dir.file("img.gz"), dir.file("lab.gz"));
  ASSERT_TRUE(d.hasValue()) << d.status().toString();
  EXPECT_EQ(d->count, 5);
  EXPECT_EQ(d->rows, 3);
  EXPECT_EQ(d->cols, 2);
  ASSERT_EQ(d->images.size(), 30u);
  for (uint32_t i = 0; i < 30; ++i) EXPECT_EQ(d->images[i], float(uint8_t(i * 37 % 256)) / 255.0f);
  EXPECT_EQ(d->labels, (std::vector<uint8_t>{0, 1, 2, 3, 4}));
}

TEST(IdxReader, PlainFilesToo) {
  TempDir dir;
  writePlain(dir.file("img"), imagesBytes(2, 4, 4));
  auto images = readIdxImages(dir.file("img"));
  ASSERT_TRUE(images.hasValue()) << images.status().toString();
  EXPECT_EQ(images->count, 2);
  EXPECT_EQ(images->pixels.size(), 32u);
  EXPECT_EQ(images->pixels[1], 37.0f / 255.0f);
}

TEST(IdxReader, ZeroImages) {
  TempDir dir;
  writeGzip(dir.file("img.gz"), imagesBytes(0, 28, 28));
  writeGzip(dir.file("lab.gz"), labelsBytes(0));
  auto d = readIdxDataset(dir.file("img.gz"), dir.file("lab.gz"));
  ASSERT_TRUE(d.hasValue()) << d.status().toString();
  EXPECT_EQ(d->count, 0);
  EXPECT_TRUE(d->images.empty());
}

TEST(IdxReader, BadMagicIsRejected) {
  TempDir dir;
  writeGzip(dir.file("lab.gz"), labelsBytes(5));
  auto images = readIdxImages(dir.file("lab.gz"));  // a label file as images
  ASSERT_FALSE(images.hasValue());
  EXPECT_THAT(images.status().message(), HasSubstr(dir.file("lab.gz")));
  EXPECT_THAT(images.status().message(), HasSubstr("bad idx magic 0x00000801, expected 0x00000803"));
  writeGzip(dir.file("img.gz"), imagesBytes(1, 2, 2));
  auto labels = readIdxLabels(dir.file("img.gz"));
  ASSERT_FALSE(labels.hasValue());
  EXPECT_THAT(labels.status().message(), HasSubstr("bad idx magic 0x00000803, expected 0x00000801"));
}

TEST(IdxReader, SizeMustMatchTheHeader) {
  TempDir dir;
  auto bytes = imagesBytes(5, 3, 2);
  bytes.resize(bytes.size() - 7);  // 16 + 30 - 7
  writeGzip(dir.file("short.gz"), bytes);
  auto images = readIdxImages(dir.file("short.gz"));
  ASSERT_FALSE(images.hasValue());
  EXPECT_EQ(images.status().code(), Status::Code::kCorruption);
  EXPECT_THAT(images.status().message(), HasSubstr(dir.file("short.gz")));
  EXPECT_THAT(images.status().message(), HasSubstr("expected 46 bytes, found 39 (truncated)"));

  auto labels = labelsBytes(4);
  labels.push_back(9);
  writeGzip(dir.file("long.gz"), labels);
  auto l = readIdxLabels(dir.file("long.gz"));
  ASSERT_FALSE(l.hasValue());
  EXPECT_THAT(l.status().message(), HasSubstr("expected 12 bytes, found 13 (trailing data)"));

  writeGzip(dir.file("tiny.gz"), {0, 0, 8});
  auto t = readIdxImages(dir.file("tiny.gz"));
  ASSERT_FALSE(t.hasValue());
  EXPECT_THAT(t.status().message(), HasSubstr("truncated idx header: expected at least 16 bytes, found 3"));
}

long maxRssKiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// A 512 MiB stream of zeros behind a header that says 10 images of 28x28:
// refused once the header's 7 856 bytes and a bounded look past them are
// read, without inflating the rest (the reader once inflated all of it).
TEST(IdxReader, AGzipBombIsRefusedAtTheSizeItsHeaderSays) {
  TempDir dir;
  const std::string path = dir.file("bomb.gz");
  {
    gzFile f = gzopen(path.c_str(), "wb9");
    ASSERT_NE(f, nullptr);
    const auto header = imagesBytes(10, 28, 28);
    ASSERT_EQ(gzwrite(f, header.data(), unsigned(header.size())), int(header.size()));
    const std::vector<uint8_t> zeros(size_t{1} << 20, 0);
    for (int i = 0; i < 512; ++i) ASSERT_EQ(gzwrite(f, zeros.data(), unsigned(zeros.size())), int(zeros.size()));
    ASSERT_EQ(gzclose(f), Z_OK);
  }
  ASSERT_LT(std::filesystem::file_size(path), 4u << 20);  // a few MB on disk
  const long rssBefore = maxRssKiB();
  const auto start = std::chrono::steady_clock::now();
  auto images = readIdxImages(path);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(images.hasValue());
  EXPECT_EQ(images.status().code(), Status::Code::kCorruption);
  EXPECT_THAT(images.status().message(), HasSubstr(path));
  EXPECT_THAT(images.status().message(),
              HasSubstr("(10 x 28 x 28): expected 7856 bytes, found more than 1056432 (trailing data; the rest was "
                        "not read)"));
  EXPECT_LT(maxRssKiB() - rssBefore, 100 * 1024) << "KiB of peak memory grown while reading";
  EXPECT_LT(seconds, 10.0) << "(it reads about 1 MB: milliseconds)";
}

// A header that claims more than the reader takes is refused before any of
// the payload is read.
TEST(IdxReader, AHeaderClaimingTooMuchIsRefused) {
  TempDir dir;
  std::vector<uint8_t> bytes;
  putBigEndian(&bytes, kIdxImagesMagic);
  for (uint32_t d : {70000u, 70000u, 70000u}) putBigEndian(&bytes, d);
  writeGzip(dir.file("huge.gz"), bytes);
  auto images = readIdxImages(dir.file("huge.gz"));
  ASSERT_FALSE(images.hasValue());
  EXPECT_THAT(images.status().message(),
              HasSubstr("the idx header (70000 x 70000 x 70000) claims 343000000000000 bytes, more than the reader "
                        "takes (4294967296)"));
}

TEST(IdxReader, TruncatedGzipStreamIsRejected) {
  TempDir dir;
  writeGzip(dir.file("img.gz"), imagesBytes(50, 10, 10));
  std::string gz = troupe::testing::readFile(dir.file("img.gz"));
  troupe::testing::writeFile(dir.file("cut.gz"), gz.substr(0, gz.size() / 2));
  auto images = readIdxImages(dir.file("cut.gz"));
  ASSERT_FALSE(images.hasValue());
  EXPECT_THAT(images.status().message(), HasSubstr(dir.file("cut.gz")));
  EXPECT_THAT(images.status().message(), ::testing::AnyOf(HasSubstr("truncated"), HasSubstr("corrupt")));
}

TEST(IdxReader, CountMismatchIsRejected) {
  TempDir dir;
  writeGzip(dir.file("img.gz"), imagesBytes(5, 3, 2));
  writeGzip(dir.file("lab.gz"), labelsBytes(4));
  auto d = readIdxDataset(dir.file("img.gz"), dir.file("lab.gz"));
  ASSERT_FALSE(d.hasValue());
  EXPECT_THAT(d.status().message(), HasSubstr("holds 5 images"));
  EXPECT_THAT(d.status().message(), HasSubstr("holds 4 labels"));
}

TEST(IdxReader, MissingFileIsAValue) {
  TempDir dir;
  auto images = readIdxImages(dir.file("none.gz"));
  ASSERT_FALSE(images.hasValue());
  EXPECT_EQ(images.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(images.status().message(), HasSubstr("none.gz': No such file or directory"));
  auto fm = loadFashionMnist(dir.path());
  ASSERT_FALSE(fm.hasValue());
  EXPECT_THAT(fm.status().message(), HasSubstr("train-images-idx3-ubyte.gz"));
}

TEST(IdxReader, FashionMnistFromTheDebianPackage) {
  // Installed by the project's setup (package dataset-fashion-mnist).
  ASSERT_TRUE(std::filesystem::exists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz"))
      << "install the Debian package dataset-fashion-mnist";
  auto fm = loadFashionMnist();
  ASSERT_TRUE(fm.hasValue()) << fm.status().toString();
  EXPECT_EQ(fm->train.count, 60000);
  EXPECT_EQ(fm->test.count, 10000);
  for (const IdxDataset* d : {&fm->train, &fm->test}) {
    EXPECT_EQ(d->rows, 28);
    EXPECT_EQ(d->cols, 28);
    EXPECT_EQ(d->images.size(), size_t(d->count) * 784);
    EXPECT_EQ(d->labels.size(), size_t(d->count));
    const auto [lo, hi] = std::minmax_element(d->images.begin(), d->images.end());
    EXPECT_EQ(*lo, 0.0f);
    EXPECT_EQ(*hi, 1.0f);
  }
  std::array<int, 10> trainCounts{}, testCounts{};
  for (uint8_t l : fm->train.labels) {
    ASSERT_LT(l, 10);
    ++trainCounts[l];
  }
  for (uint8_t l : fm->test.labels) {
    ASSERT_LT(l, 10);
    ++testCounts[l];
  }
  for (int c = 0; c < 10; ++c) {
    EXPECT_EQ(trainCounts[size_t(c)], 6000) << "class " << c;
    EXPECT_EQ(testCounts[size_t(c)], 1000) << "class " << c;
  }
}

}  // namespace
}  // namespace troupe::data
