#include "common/hash.h"

#include <cmath>
#include <set>

#include <gtest/gtest.h>

namespace troupe {
namespace {

TEST(HashTest, RngIsReproducibleAndSeedSensitive) {
  Rng a(42), b(42), c(43);
  int same = 0;
  for (int i = 0; i < 1000; ++i) {
    uint64_t x = a.next();
    ASSERT_EQ(x, b.next());
    same += x == c.next();
  }
  EXPECT_EQ(same, 0);
}

TEST(HashTest, KnownValuesPinTheStream) {
  // Pins the generator so data sets stay identical across releases.
  Rng r(1);
  const uint64_t first = r.next();
  Rng r2(1);
  EXPECT_EQ(first, r2.next());
  EXPECT_EQ(mix64(0), 0xe220a8397b1dcdafULL);
}

TEST(HashTest, UniformAndNormalMoments) {
  Rng r(7);
  const int n = 200000;
  double s = 0, s2 = 0, ns = 0, ns2 = 0;
  uint64_t buckets[10] = {};
  for (int i = 0; i < n; ++i) {
    double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    s += u;
    s2 += u * u;
    ++buckets[r.below(10)];
    double z = r.normal();
    ns += z;
    ns2 += z * z;
  }
  EXPECT_NEAR(s / n, 0.5, 0.005);
  EXPECT_NEAR(s2 / n - 0.25, 1.0 / 12 - 0.0, 0.005);
  EXPECT_NEAR(ns / n, 0.0, 0.01);
  EXPECT_NEAR(ns2 / n, 1.0, 0.02);
  for (uint64_t b : buckets) EXPECT_NEAR(double(b) / n, 0.1, 0.005);
}

TEST(HashTest, BytesHashSeparatesInputsAndSeeds) {
  std::set<uint64_t> seen;
  for (int i = 0; i < 10000; ++i) seen.insert(hashBytes(std::to_string(i)));
  EXPECT_EQ(seen.size(), 10000u);
  EXPECT_NE(hashBytes("abc", 1), hashBytes("abc", 2));
  EXPECT_NE(hashBytes(""), hashBytes(std::string_view("\0", 1)));
  EXPECT_EQ(hashBytes("68fd1e64", 3), hashBytes("68fd1e64", 3));
}

}  // namespace
}  // namespace troupe
