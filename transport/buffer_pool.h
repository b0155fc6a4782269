// BufferPool: large buffers reused instead of returned to the allocator: the
// node's receive buffers, and the buffers shards write their pull replies
// into (Tensor::fromPool). A fresh multi-megabyte allocation is mapped memory
// that page-faults while it is first written, and glibc trims it again on
// free; on these paths that cost more than the copy itself. Buffers come in
// power-of-two classes from 64 KiB; smaller ones go to the allocator. At most
// `maxCached` bytes are kept; a buffer released when the pool is full takes
// the place of a cached one of the smallest larger class (so a burst of huge
// buffers cannot keep the usual sizes out), or else goes back to the
// allocator.
//
// Ownership: a pool must be owned by a std::shared_ptr (buffers find it
// through a weak pointer; one not so owned hands out buffers but reuses
// none). A buffer may outlive its pool: it is then freed on release.
//
// Threading: thread-safe; a buffer may be released on any thread (the last
// tensor pointing into a frame may die anywhere).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

namespace troupe::transport {

class BufferPool final : public std::enable_shared_from_this<BufferPool> {
 public:
  explicit BufferPool(size_t maxCached = size_t{512} << 20) : maxCached_(maxCached) {}
  ~BufferPool() {
    for (auto& cls : free_) {
      for (uint64_t* p : cls) delete[] p;
    }
  }

  // `bytes` rounded up to whole words, not zeroed; null when out of memory.
  std::shared_ptr<uint64_t[]> get(size_t bytes) {
    const size_t words = (bytes + 7) / 8;
    const int cls = classOf(words * 8);
    if (cls < 0) {
      uint64_t* p = new (std::nothrow) uint64_t[words];
      return p ? std::shared_ptr<uint64_t[]>(p) : nullptr;
    }
    uint64_t* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_[size_t(cls)].empty()) {
        p = free_[size_t(cls)].back();
        free_[size_t(cls)].pop_back();
        cached_ -= classBytes(cls);
      }
    }
    if (!p) p = new (std::nothrow) uint64_t[classBytes(cls) / 8];
    if (!p) return nullptr;
    std::weak_ptr<BufferPool> pool = weak_from_this();
    return std::shared_ptr<uint64_t[]>(p, [pool, cls](uint64_t* q) {
      if (auto self = pool.lock()) {
        self->put(cls, q);
      } else {
        delete[] q;
      }
    });
  }

  // Bytes held for reuse now.
  size_t cachedBytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_;
  }

 private:
  static constexpr int kMinShift = 16;  // 64 KiB
  static constexpr int kClasses = 20;   // up to 32 GiB
  static size_t classBytes(int cls) { return size_t{1} << (kMinShift + cls); }
  static int classOf(size_t bytes) {
    if (bytes < (size_t{1} << kMinShift)) return -1;
    int cls = 0;
    while (classBytes(cls) < bytes) ++cls;
    return cls < kClasses ? cls : -1;
  }
  void put(int cls, uint64_t* p) {
    uint64_t* evicted = nullptr;
    bool kept = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_ + classBytes(cls) > maxCached_) {
        // One cached buffer of the smallest larger class makes room (it is
        // at least twice this one's size).
        for (int big = cls + 1; big < kClasses && evicted == nullptr; ++big) {
          if (free_[size_t(big)].empty()) continue;
          evicted = free_[size_t(big)].back();
          free_[size_t(big)].pop_back();
          cached_ -= classBytes(big);
        }
      }
      if (cached_ + classBytes(cls) <= maxCached_) {
        free_[size_t(cls)].push_back(p);
        cached_ += classBytes(cls);
        kept = true;
      }
    }
    delete[] evicted;  // (outside the lock)
    if (!kept) delete[] p;
  }

  const size_t maxCached_;
  mutable std::mutex mutex_;
  size_t cached_ = 0;
  std::vector<uint64_t*> free_[kClasses];
};

}  // namespace troupe::transport
