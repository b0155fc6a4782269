#include "data/criteo_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"

namespace troupe::data {
namespace {

using ::testing::HasSubstr;
using troupe::testing::TempDir;
using troupe::testing::writeFile;

// A line with `c` categorical fields; ints/cats shorter than needed are padded
// with "1" / "tok<t>".
std::string line(const std::string& label, std::vector<std::string> ints, std::vector<std::string> cats,
                 int c = kCriteoDefaultCategorical) {
  ints.resize(kCriteoIntFeatures, "1");
  for (size_t t = cats.size(); t < size_t(c); ++t) cats.push_back(std::string("tok").append(std::to_string(t)));
  std::string s = label;
  for (const auto& i : ints) s.append("\t").append(i);
  for (const auto& k : cats) s.append("\t").append(k);
  return s;
}

std::unique_ptr<CriteoReader> openOk(CriteoReaderOptions options) {
  auto r = CriteoReader::open(options);
  EXPECT_TRUE(r.hasValue()) << (r ? "" : r.status().toString());
  return r ? std::move(r).value() : nullptr;
}

// Reads every row of the file in batches of `batchRows`, asserting success.
CriteoBatch readAll(const CriteoReaderOptions& options, size_t batchRows, std::vector<size_t>* sizes = nullptr) {
  auto reader = openOk(options);
  CriteoBatch all, batch;
  all.numCategorical = options.numCategorical;
  for (;;) {
    auto n = reader->next(batchRows, &batch);
    EXPECT_TRUE(n.hasValue()) << (n ? "" : n.status().toString());
    if (!n || *n == 0) break;
    EXPECT_LE(*n, batchRows);
    if (sizes) sizes->push_back(*n);
    all.labels.insert(all.labels.end(), batch.labels.begin(), batch.labels.end());
    all.dense.insert(all.dense.end(), batch.dense.begin(), batch.dense.end());
    all.keys.insert(all.keys.end(), batch.keys.begin(), batch.keys.end());
  }
  return all;
}

// The error a file with one bad line produces.
std::string firstError(const std::string& path, int c = kCriteoDefaultCategorical) {
  CriteoReaderOptions options;
  options.path = path;
  options.numCategorical = c;
  auto reader = openOk(options);
  CriteoBatch batch;
  for (;;) {
    auto n = reader->next(100, &batch);
    if (!n) return n.status().message();
    if (*n == 0) return "";
  }
}

TEST(CriteoReader, ParsesValuesMissingFieldsAndKeys) {
  TempDir dir;
  const std::string path = dir.file("day.tsv");
  std::vector<std::string> ints = {"5", "", "-1", "0", "1000000", "7"};
  std::vector<std::string> cats = {"68fd1e64", "", "68fd1e64"};
  writeFile(path, line("1", ints, cats) + "\n" + line("0", {}, {"68fd1e64"}) + "\n");
  CriteoReaderOptions options;
  options.path = path;
  const CriteoBatch b = readAll(options, 10);
  ASSERT_EQ(b.rows(), 2u);
  EXPECT_EQ(b.labels[0], 1.0f);
  EXPECT_EQ(b.labels[1], 0.0f);
  ASSERT_EQ(b.dense.size(), 2u * kCriteoIntFeatures);
  EXPECT_EQ(b.dense[0], float(std::log1p(5.0)));
  EXPECT_EQ(b.dense[1], 0.0f);  // missing
  EXPECT_EQ(b.dense[2], 0.0f);  // negative
  EXPECT_EQ(b.dense[3], 0.0f);
  EXPECT_EQ(b.dense[4], float(std::log1p(1e6)));
  EXPECT_EQ(b.dense[5], float(std::log1p(7.0)));
  EXPECT_EQ(b.dense[6], float(std::log(2.0)));  // padded "1"
  ASSERT_EQ(b.keys.size(), 2u * kCriteoDefaultCategorical);
  EXPECT_EQ(b.keys[0], criteoKey(0, "68fd1e64"));
  EXPECT_EQ(b.keys[1], criteoMissingKey(1));
  EXPECT_EQ(b.keys[2], criteoKey(2, "68fd1e64"));
  EXPECT_EQ(b.keys[25], criteoKey(25, "tok25"));
  // One token in two tables: two keys; in one table: one key.
  EXPECT_NE(b.keys[0], b.keys[2]);
  EXPECT_EQ(b.keys[kCriteoDefaultCategorical + 0], b.keys[0]);
  EXPECT_NE(criteoMissingKey(1), criteoMissingKey(2));
  EXPECT_NE(criteoMissingKey(1), criteoKey(1, ""));
}

TEST(CriteoReader, AcceptsCrlfAndNoTrailingNewline) {
  TempDir dir;
  const std::string path = dir.file("crlf.tsv");
  writeFile(path, line("1", {"3"}, {"aa"}) + "\r\n" + line("0", {"4"}, {"bb"}) + "\r\n" +
                      line("1", {"5"}, {"cc"}));
  CriteoReaderOptions options;
  options.path = path;
  const CriteoBatch b = readAll(options, 2);
  ASSERT_EQ(b.rows(), 3u);
  EXPECT_EQ(b.dense[2 * kCriteoIntFeatures], float(std::log1p(5.0)));
  EXPECT_EQ(b.keys[2 * kCriteoDefaultCategorical], criteoKey(0, "cc"));
  // The '\r' is not part of the last token.
  EXPECT_EQ(b.keys[kCriteoDefaultCategorical - 1], criteoKey(25, "tok25"));
  EXPECT_EQ(countTextRows(path).value(), 3);
}

class CriteoBatchSize : public ::testing::TestWithParam<size_t> {};

TEST_P(CriteoBatchSize, BatchesConcatenateToTheWholeFile) {
  TempDir dir;
  const std::string path = dir.file("seven.tsv");
  std::string text;
  for (int i = 0; i < 7; ++i) {
    text.append(line(i % 2 ? "1" : "0", {std::to_string(i)}, {std::string("t").append(std::to_string(i))}));
    text.append("\n");
  }
  writeFile(path, text);
  CriteoReaderOptions options;
  options.path = path;
  const CriteoBatch whole = readAll(options, 1000);
  ASSERT_EQ(whole.rows(), 7u);
  std::vector<size_t> sizes;
  const CriteoBatch b = readAll(options, GetParam(), &sizes);
  EXPECT_EQ(b.labels, whole.labels);
  EXPECT_EQ(b.dense, whole.dense);
  EXPECT_EQ(b.keys, whole.keys);
  const size_t bs = GetParam();
  ASSERT_EQ(sizes.size(), (7 + bs - 1) / bs);
  for (size_t i = 0; i + 1 < sizes.size(); ++i) EXPECT_EQ(sizes[i], bs);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(b.labels[size_t(i)], float(i % 2));
    EXPECT_EQ(b.dense[size_t(i) * kCriteoIntFeatures], criteoDenseTransform(i));
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, CriteoBatchSize, ::testing::Values(1, 3, 7, 100));

TEST(CriteoReader, ConfigurableCategoricalCountAndMaxRows) {
  TempDir dir;
  const std::string path = dir.file("three.tsv");
  std::string text;
  for (int i = 0; i < 5; ++i) text += line("0", {}, {"a", "b", "c"}, 3) + "\n";
  writeFile(path, text);
  CriteoReaderOptions options;
  options.path = path;
  options.numCategorical = 3;
  options.maxRows = 4;
  const CriteoBatch b = readAll(options, 3);
  EXPECT_EQ(b.rows(), 4u);
  EXPECT_EQ(b.keys.size(), 12u);
  EXPECT_EQ(b.keys[2], criteoKey(2, "c"));
  // With the default 26 the same file is malformed.
  EXPECT_THAT(firstError(path), HasSubstr("expected 40 tab-separated fields, found 17"));
}

TEST(CriteoReader, WrongFieldCountNamesFileAndLine) {
  TempDir dir;
  const std::string path = dir.file("short.tsv");
  std::string bad = line("1", {}, {});
  bad.erase(bad.rfind('\t'));  // 39 fields
  writeFile(path, line("0", {}, {}) + "\n" + bad + "\n");
  const std::string err = firstError(path);
  EXPECT_THAT(err, HasSubstr(path + ":2:"));
  EXPECT_THAT(err, HasSubstr("expected 40 tab-separated fields, found 39"));
}

TEST(CriteoReader, BadLabelNamesFileAndLine) {
  TempDir dir;
  const std::string path = dir.file("label.tsv");
  writeFile(path, line("0", {}, {}) + "\n" + line("0", {}, {}) + "\n" + line("2", {}, {}) + "\n");
  const std::string err = firstError(path);
  EXPECT_THAT(err, HasSubstr(path + ":3:"));
  EXPECT_THAT(err, HasSubstr("label must be 0 or 1, found '2'"));
}

TEST(CriteoReader, NonIntegerNamesTheColumn) {
  TempDir dir;
  const std::string path = dir.file("int.tsv");
  writeFile(path, line("1", {"1", "2", "3", "4", "12a"}, {}) + "\n");
  const std::string err = firstError(path);
  EXPECT_THAT(err, HasSubstr(path + ":1:"));
  EXPECT_THAT(err, HasSubstr("integer column I5"));
  EXPECT_THAT(err, HasSubstr("'12a' is not an integer"));
  writeFile(path, line("1", {"1.5"}, {}) + "\n");
  EXPECT_THAT(firstError(path), HasSubstr("integer column I1 (field 2): '1.5' is not an integer"));
  writeFile(path, line("1", {"99999999999999999999"}, {}) + "\n");
  EXPECT_THAT(firstError(path), HasSubstr("out of the 64-bit range"));
}

TEST(CriteoReader, OverLongLineIsAnErrorNotAnAllocation) {
  TempDir dir;
  const std::string path = dir.file("long.tsv");
  writeFile(path, line("1", {}, {}) + "\n" + std::string(300000, 'x') + "\n" + line("0", {}, {}) + "\n");
  CriteoReaderOptions options;
  options.path = path;
  options.maxLineBytes = 1000;
  options.bufferBytes = 4096;
  auto reader = openOk(options);
  CriteoBatch batch;
  auto n = reader->next(10, &batch);
  ASSERT_FALSE(n.hasValue());
  EXPECT_THAT(n.status().message(), HasSubstr(path + ":2: line longer than 1000 bytes"));
  EXPECT_EQ(batch.rows(), 1u);  // the rows before the bad line stay
  // The reader goes on after the bad line.
  n = reader->next(10, &batch);
  ASSERT_TRUE(n.hasValue());
  EXPECT_EQ(*n, 1u);
  EXPECT_EQ(reader->lineNumber(), 3);
}

TEST(CriteoReader, MissingFileIsAValue) {
  TempDir dir;
  CriteoReaderOptions options;
  options.path = dir.file("nope.tsv");
  auto r = CriteoReader::open(options);
  ASSERT_FALSE(r.hasValue());
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(options.path));
  EXPECT_THAT(r.status().message(), HasSubstr("No such file or directory"));
  EXPECT_FALSE(countTextRows(options.path).hasValue());
}

TEST(CriteoReader, SkipBadLinesCountsAndKeepsGoodRows) {
  TempDir dir;
  const std::string path = dir.file("mixed.tsv");
  std::string text;
  text += line("1", {"3"}, {"good1"}) + "\n";
  text += line("7", {}, {}) + "\n";            // bad label
  text += line("0", {"x"}, {}) + "\n";         // bad integer
  text += line("0", {"4"}, {"good2"}) + "\n";
  text += "1\t2\t3\n";                          // field count
  text += "\n";                                 // empty line: 1 field
  text += line("1", {"5"}, {"good3"});          // no trailing newline
  writeFile(path, text);
  CriteoReaderOptions options;
  options.path = path;
  options.skipBadLines = true;
  auto reader = openOk(options);
  CriteoBatch batch;
  auto n = reader->next(100, &batch);
  ASSERT_TRUE(n.hasValue()) << n.status().toString();
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(reader->badLines(), 4);
  EXPECT_EQ(reader->rowsRead(), 3);
  EXPECT_EQ(batch.labels, (std::vector<float>{1, 0, 1}));
  EXPECT_EQ(batch.dense[kCriteoIntFeatures], float(std::log1p(4.0)));
  EXPECT_EQ(batch.keys[kCriteoDefaultCategorical], criteoKey(0, "good2"));
  EXPECT_EQ(batch.keys[2 * kCriteoDefaultCategorical], criteoKey(0, "good3"));
  EXPECT_EQ(*reader->next(100, &batch), 0u);

  // rewind() starts over with fresh counters.
  ASSERT_TRUE(reader->rewind().isOk());
  n = reader->next(2, &batch);
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(reader->badLines(), 2);
}

TEST(CriteoReader, SkippingRowsLandsWhereReadingThemWouldOnEveryKindOfLine) {
  TempDir dir;
  const std::string path = dir.file("kinds.tsv");
  std::string text;
  text += line("1", {"1"}, {}) + "\r\n";               // good row 0, "\r\n"
  text += "\n";                                        // empty: bad
  text += line("0", {"2"}, {}) + "\n";                 // good row 1
  text += line("0", {"3"}, {std::string(300, 'k')}) + "\n";  // too long: bad
  text += line("1", {"4"}, {}) + "\r\n";               // good row 2
  text += line("2", {"5"}, {}) + "\n";                 // bad label
  text += line("0", {"6"}, {}) + "\n";                 // good row 3
  text += line("1", {"7"}, {});                        // good row 4, no newline
  writeFile(path, text);
  const std::vector<float> firstInts = {1, 2, 4, 6, 7};
  const std::vector<float> labels = {1, 0, 1, 0, 1};
  for (bool skipBad : {true, false}) {
    for (size_t k = 0; k <= 5; ++k) {
      SCOPED_TRACE(::testing::Message() << "skip bad " << skipBad << ", " << k << " rows skipped");
      CriteoReaderOptions options;
      options.path = path;
      options.skipBadLines = skipBad;
      options.maxLineBytes = 200;
      options.logBadLines = 0;
      auto reader = openOk(options);
      auto skipped = reader->skip(k);
      ASSERT_TRUE(skipped.hasValue()) << "skip never fails on a bad line: " << skipped.status().toString();
      if (!skipBad) {
        // Failing on bad lines, every line is a row: 8 lines.
        EXPECT_EQ(*skipped, k);
        EXPECT_EQ(reader->lineNumber(), int64_t(k));
        continue;
      }
      EXPECT_EQ(*skipped, k);
      CriteoBatch batch;
      auto n = reader->next(100, &batch);
      ASSERT_TRUE(n.hasValue()) << n.status().toString();
      ASSERT_EQ(*n, 5 - k);
      for (size_t r = 0; r < *n; ++r) {
        EXPECT_EQ(batch.labels[r], labels[k + r]);
        EXPECT_EQ(batch.dense[r * kCriteoIntFeatures], float(std::log1p(double(firstInts[k + r]))));
      }
      EXPECT_EQ(reader->badLines(), 3);
      EXPECT_EQ(reader->rowsRead(), 5);
      EXPECT_EQ(reader->skip(10).value(), 0u);
    }
  }
  // Failing on bad lines, the 8 lines are 8 rows to skip.
  CriteoReaderOptions options;
  options.path = path;
  options.maxLineBytes = 200;
  auto reader = openOk(options);
  EXPECT_EQ(reader->skip(100).value(), 8u);
  EXPECT_EQ(reader->badLines(), 0);
}

TEST(CriteoReader, CountTextRows) {
  TempDir dir;
  const std::string path = dir.file("count.txt");
  writeFile(path, "");
  EXPECT_EQ(countTextRows(path).value(), 0);
  writeFile(path, "a\nb\n\nc");
  EXPECT_EQ(countTextRows(path).value(), 3);
  writeFile(path, "a\r\nb\r\n");
  EXPECT_EQ(countTextRows(path).value(), 2);
}

}  // namespace
}  // namespace troupe::data
