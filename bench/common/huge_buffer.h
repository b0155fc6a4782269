// HugeBuffer: a large, 2 MiB-aligned, zero-filled float buffer backed by
// transparent huge pages where the kernel allows (madvise), with its pages
// touched up front so that no benchmark times page faults.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/huge_pages.h"

namespace troupe::bench {

class HugeBuffer final {
 public:
  explicit HugeBuffer(size_t bytes);
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;

  float* floats() { return static_cast<float*>(memory_.data()); }
  void* data() { return memory_.data(); }
  size_t bytes() const { return bytes_; }

 private:
  TableMemory memory_;  // on huge pages (common/huge_pages.h)
  size_t bytes_ = 0;
};

}  // namespace troupe::bench
