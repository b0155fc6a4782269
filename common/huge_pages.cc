#include "common/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <new>
#include <sstream>
#include <utility>

namespace troupe {
namespace {

size_t roundUp(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

}  // namespace

TableMemory::TableMemory(size_t bytes, bool huge) : bytes_(bytes == 0 ? 1 : bytes), huge_(huge) {
  if (bytes_ > SIZE_MAX - 2 * kHugePageBytes) throw std::bad_alloc();  // (the rounding below would wrap)
  if (!huge_) {
    data_ = std::aligned_alloc(64, roundUp(bytes_, 64));
    if (data_ == nullptr) throw std::bad_alloc();
    return;
  }
  // A mapping of one huge page more than needed, trimmed to a 2 MiB-aligned
  // start (a huge page can only back an aligned 2 MiB of addresses).
  const size_t keep = roundUp(bytes_, kHugePageBytes);
  void* raw = ::mmap(nullptr, keep + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = roundUp(start, kHugePageBytes);
  if (aligned > start) ::munmap(raw, aligned - start);
  const uintptr_t end = start + keep + kHugePageBytes;
  if (end > aligned + keep) ::munmap(reinterpret_cast<void*>(aligned + keep), end - (aligned + keep));
  data_ = reinterpret_cast<void*>(aligned);
  ::madvise(data_, keep, MADV_HUGEPAGE);  // best effort: ordinary pages where the kernel says no
}

TableMemory::~TableMemory() { release(); }

TableMemory::TableMemory(TableMemory&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), huge_(o.huge_) {}

TableMemory& TableMemory::operator=(TableMemory&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    huge_ = o.huge_;
  }
  return *this;
}

void TableMemory::release() noexcept {
  if (data_ == nullptr) return;
  if (huge_) {
    ::munmap(data_, roundUp(bytes_, kHugePageBytes));
  } else {
    std::free(data_);
  }
  data_ = nullptr;
}

std::string parseTransparentHugePageMode(const std::string& text) {
  const size_t open = text.find('[');
  const size_t close = open == std::string::npos ? open : text.find(']', open);
  if (close == std::string::npos || close == open + 1) return "unavailable";
  return text.substr(open + 1, close - open - 1);
}

std::string transparentHugePages() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  if (!in) return "unavailable";
  std::stringstream text;
  text << in.rdbuf();
  return parseTransparentHugePageMode(text.str());
}

}  // namespace troupe
