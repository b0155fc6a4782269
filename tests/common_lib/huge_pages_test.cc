#include "common/huge_pages.h"

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace troupe {
namespace {

// Huge memory starts on a 2 MiB boundary (so that the kernel can back it
// with whole huge pages), ordinary memory on a cache line; every byte asked
// for is usable, and moving one hands its memory over. (Whether the kernel
// does back it with huge pages depends on its transparent_hugepage
// setting, which a test cannot choose.)
TEST(HugePagesTest, HugeMemoryStartsOnAHugePageAndOrdinaryOnACacheLine) {
  for (bool huge : {false, true}) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{100}, kHugePageBytes - 1, kHugePageBytes, kHugePageBytes + 1,
                         size_t{5} << 20}) {
      TableMemory m(bytes, huge);
      ASSERT_NE(m.data(), nullptr) << bytes;
      EXPECT_EQ(m.huge(), huge);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data()) % (huge ? kHugePageBytes : 64), 0u) << bytes << (huge ? " huge" : "");
      std::memset(m.data(), 0xab, bytes);
      if (bytes > 0) EXPECT_EQ(static_cast<unsigned char*>(m.data())[bytes - 1], 0xab);
      TableMemory moved(std::move(m));
      EXPECT_EQ(m.data(), nullptr);
      if (bytes > 0) EXPECT_EQ(static_cast<unsigned char*>(moved.data())[0], 0xab);
      TableMemory other(64, !huge);
      other = std::move(moved);  // frees its own, takes the other's
      EXPECT_EQ(other.huge(), huge);
      if (bytes > 0) EXPECT_EQ(static_cast<unsigned char*>(other.data())[bytes - 1], 0xab);
    }
  }
}

TEST(HugePagesTest, TheModeIsTheBracketedWord) {
  EXPECT_EQ(parseTransparentHugePageMode("always [madvise] never\n"), "madvise");
  EXPECT_EQ(parseTransparentHugePageMode("[always] madvise never\n"), "always");
  EXPECT_EQ(parseTransparentHugePageMode("always madvise [never]"), "never");
  EXPECT_EQ(parseTransparentHugePageMode(""), "unavailable");
  EXPECT_EQ(parseTransparentHugePageMode("always madvise never"), "unavailable");
  EXPECT_EQ(parseTransparentHugePageMode("always [] never"), "unavailable");
  EXPECT_EQ(parseTransparentHugePageMode("always [madvise"), "unavailable");
}

}  // namespace
}  // namespace troupe
