// uniqueKeys and dedupGradients against a first-seen-order reference, with
// heavy duplicates, extreme key values and thread-count independence.
#include <map>
#include <tuple>

#include "tests/kernels/kernel_test_util.h"

namespace troupe::kernels::test {
namespace {

struct Reference {
  std::vector<uint64_t> unique;
  std::vector<int64_t> inverse;
};

Reference referenceUnique(const std::vector<uint64_t>& keys) {
  Reference r;
  std::map<uint64_t, int64_t> ids;
  for (uint64_t k : keys) {
    auto [it, inserted] = ids.try_emplace(k, int64_t(r.unique.size()));
    if (inserted) r.unique.push_back(k);
    r.inverse.push_back(it->second);
  }
  return r;
}

// keyRange 0: any 64-bit key; otherwise keys in [0, keyRange) plus a few extremes.
std::vector<uint64_t> randomKeys(Rng& rng, int64_t n, uint64_t keyRange) {
  std::vector<uint64_t> keys(n);
  for (auto& k : keys) k = keyRange == 0 ? rng.next() : rng.below(keyRange);
  if (n > 3) {
    keys[n / 3] = ~uint64_t{0};
    keys[n / 2] = 0;
    keys[n - 1] = ~uint64_t{0};
  }
  return keys;
}

using Case = std::tuple<int64_t, uint64_t, int64_t>;  // n, key range, dim

class KeyDedupTest : public ::testing::TestWithParam<Case> {};

TEST_P(KeyDedupTest, MatchesReference) {
  const auto [n, keyRange, dim] = GetParam();
  Rng rng(n * 31 + keyRange + dim);
  const std::vector<uint64_t> keys = randomKeys(rng, n, keyRange);
  const std::vector<float> grads = randomFloats(rng, n * dim);
  const Reference ref = referenceUnique(keys);
  const int64_t count = int64_t(ref.unique.size());
  std::vector<double> summedRef(count * dim, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t d = 0; d < dim; ++d) summedRef[ref.inverse[i] * dim + d] += grads[i * dim + d];
  }

  std::vector<float> first;
  for (int threads : {1, 2}) {
    auto k = makeKernels(threads);
    std::vector<uint64_t> unique(n, 12345);
    std::vector<int64_t> inverse(n, -7);
    Expected<int64_t> got = k->uniqueKeys(keys.data(), n, unique.data(), inverse.data());
    ASSERT_TRUE(got.hasValue());
    ASSERT_EQ(*got, count);
    unique.resize(count);
    EXPECT_EQ(unique, ref.unique);
    EXPECT_EQ(inverse, ref.inverse);

    std::vector<float> summed(n * dim, 99.0f);
    std::fill(inverse.begin(), inverse.end(), -7);
    got = k->dedupGradients(keys.data(), grads.data(), n, dim, unique.data(), summed.data(),
                            inverse.data());
    ASSERT_TRUE(got.hasValue());
    ASSERT_EQ(*got, count);
    EXPECT_EQ(inverse, ref.inverse);
    summed.resize(count * dim);
    expectClose(summed, summedRef, 1e-5, 1e-5, "summed");
    if (threads == 1) {
      first = summed;
    } else {
      EXPECT_TRUE(bitEqual(first, summed)) << "dedup differs between 1 and 2 threads";
    }
    // A second call on the same object (reused table) gives the same answer.
    std::vector<int64_t> again(n);
    ASSERT_EQ(*k->uniqueKeys(keys.data(), n, unique.data(), again.data()), count);
    EXPECT_EQ(again, ref.inverse);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, KeyDedupTest,
                         ::testing::Values(Case{0, 0, 4}, Case{1, 0, 1}, Case{2, 1, 3},
                                           Case{17, 0, 0}, Case{1000, 7, 17}, Case{5000, 0, 16},
                                           Case{100000, 5000, 8}, Case{100000, 0, 1}));

TEST(KeyDedup, RejectsNegativeSizes) {
  auto k = makeKernels(1);
  uint64_t key = 1, unique = 0;
  int64_t inverse = 0;
  EXPECT_EQ(k->uniqueKeys(&key, -1, &unique, &inverse).status().code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace troupe::kernels::test
