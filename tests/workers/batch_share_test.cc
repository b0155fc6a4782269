// A worker's share of the data (everyNthBatch) and a division made again
// from a given batch (BatchSource::reshare), directly and through the
// loader actor (share_atom drops what it read ahead); a Criteo file's
// shares, whose other batches are skipped unparsed.
#include <caf/all.hpp>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "data/criteo_reader.h"
#include "tests/common/temp_dir.h"
#include "workers/batch_source.h"
#include "workers/loader_actor.h"
#include "workers/messages.h"

namespace troupe::workers {
namespace {

using namespace std::chrono_literals;

// Ten batches a epoch, numbered 0..9; each knows its epoch by firstRow.
class Numbers final : public BatchSource {
 public:
  Status startEpoch(int64_t epoch) override {
    epoch_ = epoch;
    next_ = 0;
    return Status::ok();
  }
  Expected<BatchPtr> next() override {
    if (next_ >= 10) return BatchPtr();
    auto b = std::make_shared<Batch>();
    b->index = next_++;
    b->firstRow = epoch_;
    b->rows = 1;
    return BatchPtr(b);
  }
  int64_t rowsPerEpoch() const override { return 10; }

 private:
  int64_t epoch_ = 0, next_ = 0;
};

std::vector<int64_t> epochOf(BatchSource& s, int64_t epoch) {
  std::vector<int64_t> out;
  EXPECT_TRUE(s.startEpoch(epoch).isOk());
  for (;;) {
    auto b = s.next();
    EXPECT_TRUE(b.hasValue());
    if (!b.hasValue() || !*b) return out;
    EXPECT_EQ((*b)->firstRow, epoch);
    out.push_back((*b)->index);
  }
}

TEST(BatchShare, EveryNthAndADivisionMadeAgainFromABatch) {
  auto share = everyNthBatch(std::make_shared<Numbers>(), 1, 3);
  EXPECT_EQ(epochOf(*share, 0), (std::vector<int64_t>{1, 4, 7}));
  // A group of 3 took 2 steps of epoch 1 (batches 0-5); 2 ranks divide the rest.
  ASSERT_TRUE(share->reshare(1, 6, 1, 2).isOk());
  EXPECT_EQ(epochOf(*share, 1), (std::vector<int64_t>{7, 9}));
  EXPECT_EQ(epochOf(*share, 2), (std::vector<int64_t>{1, 3, 5, 7, 9}));  // later epochs from batch 0
  auto first = everyNthBatch(std::make_shared<Numbers>(), 0, 3);
  ASSERT_TRUE(first->reshare(1, 6, 0, 2).isOk());
  EXPECT_EQ(epochOf(*first, 1), (std::vector<int64_t>{6, 8}));
  // Every batch from 6 on once, between the two.
  ASSERT_TRUE(first->reshare(0, 4, 0, 1).isOk());
  EXPECT_EQ(epochOf(*first, 0), (std::vector<int64_t>{4, 5, 6, 7, 8, 9}));
  // Nonsense is refused, naming it; other sources are no share.
  Status s = share->reshare(0, 0, 2, 2);
  EXPECT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("part 2 of 2 from batch 0 of epoch 0"), std::string::npos) << s.message();
  EXPECT_FALSE(share->reshare(-1, 0, 0, 1).isOk());
  EXPECT_FALSE(Numbers().reshare(0, 0, 0, 1).isOk());
}

TEST(BatchShare, TheLoaderDropsWhatItReadAheadUnderTheOldDivision) {
  caf::actor_system_config cfg;
  caf::actor_system system{cfg};
  auto loader = spawnLoader(system, everyNthBatch(std::make_shared<Numbers>(), 0, 2), 4);
  caf::scoped_actor self{system};
  auto next = [&] {
    int64_t index = -2;
    self->request(loader, 10s, next_atom::value)
        .receive([&](BatchPtr b) { index = b ? b->index : -1; }, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
    return index;
  };
  self->request(loader, 10s, epoch_atom::value, int64_t{0}).receive([](int64_t) {}, [](caf::error&) { FAIL(); });
  EXPECT_EQ(next(), 0);
  EXPECT_EQ(next(), 2);  // it has read batches 4, 6, 8 ahead by now
  self->request(loader, 10s, share_atom::value, int64_t{0}, int64_t{4}, int64_t{1}, int64_t{3})
      .receive([](int64_t) {}, [](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
  EXPECT_EQ(next(), -1) << "nothing until the epoch starts again";
  self->request(loader, 10s, epoch_atom::value, int64_t{0}).receive([](int64_t) {}, [](caf::error&) { FAIL(); });
  EXPECT_EQ(next(), 5);
  EXPECT_EQ(next(), 8);
  EXPECT_EQ(next(), -1);
  self->request(loader, 10s, share_atom::value, int64_t{0}, int64_t{0}, int64_t{3}, int64_t{3})
      .receive([](int64_t) { ADD_FAILURE() << "a part past the parts was taken"; }, [](caf::error&) {});
  self->send_exit(loader, caf::exit_reason::user_shutdown);
}

// A Criteo file whose good row r has label r % 2 and I1 = r, with bad lines
// of three kinds among them (every 5th line from the 3rd: a field missing,
// label 2, an integer that is not one). rows: the good rows.
std::string criteoFile(const testing::TempDir& dir, int rows, bool withBad) {
  std::string text;
  int line = 0;
  for (int r = 0; r < rows;) {
    ++line;
    std::string ints = std::to_string(r);
    for (int j = 1; j < data::kCriteoIntFeatures; ++j) ints.append("\t").append(std::to_string(j));
    std::string cats;
    for (int t = 0; t < 3; ++t) cats.append("\ttok").append(std::to_string((r + t) % 7));
    if (withBad && line % 5 == 3) {
      const int kind = (line / 5) % 3;
      // (appended piece by piece: GCC 12 warns on a chain of + here)
      if (kind == 0) text.append("1\t").append(ints).append("\ttok0\ttok1\n");
      if (kind == 1) text.append("2\t").append(ints).append(cats).append("\n");
      if (kind == 2) text.append("0\tx").append(ints).append(cats).append("\n");
      continue;
    }
    text.append(std::to_string(r % 2)).append("\t").append(ints).append(cats).append("\n");
    ++r;
  }
  const std::string path = dir.file(withBad ? "bad.tsv" : "good.tsv");
  testing::writeFile(path, text);
  return path;
}

CriteoSourceOptions criteoOptions(const std::string& path, bool skipBad, bool inMemory) {
  CriteoSourceOptions o;
  o.path = path;
  o.batchSize = 4;
  o.numCategorical = 3;
  o.skipBadLines = skipBad;
  o.inMemory = inMemory;
  return o;
}

// Asserts batch b holds good rows 4 * index .. of a file with `rows` good
// rows, and returns its index.
int64_t checkRows(const BatchPtr& b, int rows) {
  const int64_t first = b->index * 4;
  EXPECT_EQ(b->firstRow, first);
  EXPECT_EQ(b->rows, std::min<int64_t>(4, rows - first));
  for (int64_t i = 0; i < b->rows; ++i) {
    const int64_t r = first + i;
    EXPECT_EQ(b->labels[size_t(i)], float(r % 2)) << "batch " << b->index << " row " << i;
    EXPECT_EQ(b->dense[size_t(i * data::kCriteoIntFeatures)], float(std::log1p(double(r))))
        << "batch " << b->index << " row " << i;
  }
  return b->index;
}

// One epoch of a share: its batch indexes, each checked against the file.
std::vector<int64_t> criteoEpoch(BatchSource& s, int64_t epoch, int rows, std::vector<BatchPtr>* kept = nullptr) {
  std::vector<int64_t> out;
  EXPECT_TRUE(s.startEpoch(epoch).isOk());
  for (int guard = 0; guard < 1000; ++guard) {
    auto b = s.next();
    EXPECT_TRUE(b.hasValue()) << (b ? "" : b.status().toString());
    if (!b.hasValue() || !*b) return out;
    out.push_back(checkRows(*b, rows));
    if (kept) kept->push_back(*b);
  }
  ADD_FAILURE() << "no end of the epoch";
  return out;
}

TEST(CriteoShare, TheSharesTogetherReadEveryRowOnceEvenAcrossBadLines) {
  testing::TempDir dir;
  const int rows = 50;  // 13 batches, the last of 2 rows
  for (bool withBad : {false, true}) {
    const std::string path = criteoFile(dir, rows, withBad);
    for (bool inMemory : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "bad lines " << withBad << ", in memory " << inMemory);
      std::map<int64_t, int> seen;
      for (int part = 0; part < 3; ++part) {
        std::shared_ptr<BatchSource> file = std::move(openCriteoSource(criteoOptions(path, withBad, inMemory))).value();
        auto share = everyNthBatch(file, part, 3);
        std::vector<BatchPtr> first, second;
        const auto indexes = criteoEpoch(*share, 0, rows, &first);
        for (int64_t i : indexes) {
          EXPECT_EQ(i % 3, part);
          ++seen[i];
        }
        EXPECT_EQ(criteoEpoch(*share, 1, rows, &second), indexes);
        // Every line of the file was passed over: all bad lines are counted.
        EXPECT_EQ(share->badLines(), withBad ? 12 : 0);
        EXPECT_EQ(file->rowsPerEpoch(), rows);
        // The cache replays the same batches; without it they are read again.
        for (size_t k = 0; k < first.size(); ++k) EXPECT_EQ(first[k] == second[k], inMemory) << "batch " << k;
      }
      ASSERT_EQ(seen.size(), 13u);
      for (const auto& [i, n] : seen) EXPECT_EQ(n, 1) << "batch " << i;
      EXPECT_EQ(seen.rbegin()->first, 12);
    }
  }
}

TEST(CriteoShare, ADivisionMadeAgainReadsTheBatchesItsFirstPassSkipped) {
  testing::TempDir dir;
  const int rows = 50;
  const std::string path = criteoFile(dir, rows, true);
  std::shared_ptr<BatchSource> file = std::move(openCriteoSource(criteoOptions(path, true, true))).value();
  auto share = everyNthBatch(file, 1, 3);
  std::vector<BatchPtr> first;
  EXPECT_EQ(criteoEpoch(*share, 0, rows, &first), (std::vector<int64_t>{1, 4, 7, 10}));
  // Two ranks divide epoch 1 from batch 5: this one takes 5, 7, 9, 11 (5,
  // 9 and 11 were another's in epoch 0 and never parsed here).
  ASSERT_TRUE(share->reshare(1, 5, 0, 2).isOk());
  std::vector<BatchPtr> second;
  EXPECT_EQ(criteoEpoch(*share, 1, rows, &second), (std::vector<int64_t>{5, 7, 9, 11}));
  EXPECT_EQ(second[1], first[2]) << "batch 7 was in the cache";
  // Later epochs: 0, 2, ..., 12; 5, 9 and 11 are cached now, the rest are read.
  std::vector<BatchPtr> third;
  EXPECT_EQ(criteoEpoch(*share, 2, rows, &third), (std::vector<int64_t>{0, 2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(third[2], first[1]) << "batch 4 was in the cache";
  std::vector<BatchPtr> fourth;
  EXPECT_EQ(criteoEpoch(*share, 3, rows, &fourth), (std::vector<int64_t>{0, 2, 4, 6, 8, 10, 12}));
  for (size_t k = 0; k < third.size(); ++k) EXPECT_EQ(third[k], fourth[k]) << "batch " << third[k]->index;
  EXPECT_EQ(file->rowsPerEpoch(), rows);
  EXPECT_EQ(share->badLines(), 12) << "reading the holes again counts no bad line twice";
}

TEST(CriteoShare, AFileThatChangedUnderTheCacheIsAnErrorNamingIt) {
  testing::TempDir dir;
  const std::string path = criteoFile(dir, 50, false);
  std::shared_ptr<BatchSource> file = std::move(openCriteoSource(criteoOptions(path, false, true))).value();
  auto share = everyNthBatch(file, 0, 2);
  EXPECT_EQ(criteoEpoch(*share, 0, 50).size(), 7u);
  ASSERT_TRUE(share->reshare(1, 0, 1, 2).isOk());  // now the odd batches: holes in the cache
  // The file loses its last 3 rows: batch 11 has 3 rows where it had 4.
  ASSERT_EQ(criteoFile(dir, 47, false), path);
  ASSERT_TRUE(share->startEpoch(1).isOk());
  Status failure;
  std::vector<int64_t> read;
  for (int guard = 0; guard < 20 && failure.isOk(); ++guard) {
    auto b = share->next();
    if (!b.hasValue()) {
      failure = b.status();
    } else if (!*b) {
      break;
    } else {
      read.push_back((*b)->index);
    }
  }
  EXPECT_EQ(read, (std::vector<int64_t>{1, 3, 5, 7, 9}));
  EXPECT_EQ(failure.message(),
            path + ": batch 11 now reads 3 rows where the first pass read 4: the file changed while training");
}

TEST(CriteoShare, FailingOnBadLinesOnlyTheShareThatParsesOneFails) {
  testing::TempDir dir;
  std::string text;
  for (int r = 0; r < 12; ++r) {
    std::string l = std::to_string(r % 2);
    for (int j = 0; j < data::kCriteoIntFeatures; ++j) l.append("\t").append(std::to_string(j == 0 ? r : j));
    l += "\ta\tb\tc\n";
    text += r == 6 ? "0\t1\tbroken\n" : l;  // line 7: batch 1 (lines 5-8)
  }
  const std::string path = dir.file("f.tsv");
  testing::writeFile(path, text);
  std::shared_ptr<BatchSource> other = std::move(openCriteoSource(criteoOptions(path, false, true))).value();
  auto share0 = everyNthBatch(other, 0, 2);
  ASSERT_TRUE(share0->startEpoch(0).isOk());
  auto b = share0->next();
  ASSERT_TRUE(b.hasValue() && *b);
  EXPECT_EQ((*b)->index, 0);
  b = share0->next();  // batch 1 passed over unchecked
  ASSERT_TRUE(b.hasValue() && *b) << (b ? "" : b.status().toString());
  EXPECT_EQ((*b)->index, 2);
  EXPECT_EQ((*b)->firstRow, 8);
  EXPECT_EQ((*b)->labels, (std::vector<float>{0, 1, 0, 1}));
  std::shared_ptr<BatchSource> owner = std::move(openCriteoSource(criteoOptions(path, false, true))).value();
  auto share1 = everyNthBatch(owner, 1, 2);
  ASSERT_TRUE(share1->startEpoch(0).isOk());
  b = share1->next();
  ASSERT_FALSE(b.hasValue());
  EXPECT_EQ(b.status().message(), path + ":7: expected 17 tab-separated fields, found 3");
}

TEST(CriteoReaderSkip, SkippedBatchesLeaveTheReaderWhereReadingThemWould) {
  testing::TempDir dir;
  const std::string path = criteoFile(dir, 50, true);
  data::CriteoReaderOptions o;
  o.path = path;
  o.numCategorical = 3;
  o.skipBadLines = true;
  o.logBadLines = 0;
  o.maxRows = 30;
  auto reader = std::move(data::CriteoReader::open(o)).value();
  data::CriteoBatch batch;
  // Skip 7 + 7 rows, read 7, skip the rest: maxRows holds for both.
  EXPECT_EQ(reader->skip(7).value(), 7u);
  EXPECT_EQ(reader->skip(7).value(), 7u);
  ASSERT_EQ(reader->next(7, &batch).value(), 7u);
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(batch.dense[i * data::kCriteoIntFeatures], float(std::log1p(14.0 + i)));
  EXPECT_EQ(reader->skip(20).value(), 9u);
  EXPECT_EQ(reader->skip(20).value(), 0u);
  EXPECT_EQ(reader->rowsRead(), 30);
  // Good row 29 is line 37: 7 bad lines among the first 37 (3, 8, ..., 33).
  EXPECT_EQ(reader->badLines(), 7);
}

}  // namespace
}  // namespace troupe::workers
