#include "bench/common/huge_buffer.h"

#include <cstring>

namespace troupe::bench {

HugeBuffer::HugeBuffer(size_t bytes) : memory_(bytes, /*huge=*/true), bytes_(bytes) {
  std::memset(memory_.data(), 0, bytes);
}

}  // namespace troupe::bench
