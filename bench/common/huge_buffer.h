// HugeBuffer: a large, 2 MiB-aligned, zero-filled float buffer backed by
// transparent huge pages where the kernel allows (madvise), with its pages
// touched up front so that no benchmark times page faults.
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe::bench {

class HugeBuffer final {
 public:
  explicit HugeBuffer(size_t bytes);
  ~HugeBuffer();
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;

  float* floats() { return static_cast<float*>(data_); }
  void* data() { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace troupe::bench
