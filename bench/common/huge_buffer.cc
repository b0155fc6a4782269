#include "bench/common/huge_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "common/check.h"

namespace troupe::bench {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

HugeBuffer::HugeBuffer(size_t bytes) : bytes_(bytes) {
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  data_ = std::aligned_alloc(kHugePage, rounded > 0 ? rounded : kHugePage);
  TROUPE_CHECK(data_ != nullptr, "HugeBuffer: cannot allocate {} bytes", rounded);
  madvise(data_, rounded, MADV_HUGEPAGE);  // best effort
  std::memset(data_, 0, rounded);
}

HugeBuffer::~HugeBuffer() { std::free(data_); }

}  // namespace troupe::bench
