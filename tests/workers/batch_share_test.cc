// A worker's share of the data (everyNthBatch) and a division made again
// from a given batch (BatchSource::reshare), directly and through the
// loader actor (share_atom drops what it read ahead).
#include <caf/all.hpp>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace troupe::workers
