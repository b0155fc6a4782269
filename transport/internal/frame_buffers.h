// FrameBuffers: the node's receive buffers for small frames (up to
// kMaxBytes), recycled without a lock. A small frame is handed to an actor
// on another thread and its buffer dies there (with the message's last
// tensor); from the allocator that was a free on one thread of memory
// another thread allocated, per message, which glibc serves through its
// arena locks and slow paths (at 4 KiB messages the receiving threads spent
// about a fifth of their time in malloc and free).
//
// Here a buffer and its shared_ptr's control block are one block. Whoever
// drops the last reference pushes the block onto a lock-free stack; the
// progress side takes the whole stack at once when it next needs a buffer,
// and keeps at most kMaxCachedBytes for reuse. Blocks come in size classes
// of 1, 1.5, 2, 3, 4, 6 ... 64 KiB (at most half again what a frame needs).
//
// Ownership: a buffer may outlive its FrameBuffers (a message kept by an
// actor after the node stopped): such buffers are freed once the last of
// them is released. A class whose blocks fill the bound does not give way
// to another: that one's blocks then come from malloc and go back to it.
//
// Threading: get() from one thread at a time (the node calls it holding its
// worker); buffers are released on any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>

namespace troupe::transport::internal {

class FrameBuffers {
 public:
  static constexpr size_t kMaxBytes = size_t{64} << 10;
  static constexpr size_t kMaxCachedBytes = size_t{8} << 20;

  FrameBuffers() : shared_(std::make_shared<Shared>()) {}
  ~FrameBuffers() {
    takeReturned();
    for (Block*& list : free_) {
      while (list) std::free(std::exchange(list, list->next));
    }
  }
  FrameBuffers(const FrameBuffers&) = delete;
  FrameBuffers& operator=(const FrameBuffers&) = delete;

  // At least `bytes` (at most kMaxBytes) 8-byte aligned bytes, not zeroed;
  // null when out of memory.
  std::shared_ptr<uint64_t[]> get(size_t bytes) {
    const int cls = classOf(bytes);
    if (cls < 0) return nullptr;
    if (!free_[cls]) takeReturned();
    Block* b = free_[cls];
    if (b) {
      free_[cls] = b->next;
      cached_ -= classBytes(cls);
    } else {
      b = static_cast<Block*>(std::malloc(kHead + classBytes(cls)));
      if (!b) return nullptr;
      b->cls = cls;
    }
    b->next = nullptr;
    auto* data = reinterpret_cast<uint64_t*>(reinterpret_cast<std::byte*>(b) + kHead);
    return std::shared_ptr<uint64_t[]>(data, [](uint64_t*) {}, Placement<uint64_t>{shared_, b});
  }

  // Bytes held for reuse now (blocks released but not yet taken back are
  // not counted).
  size_t cachedBytes() const { return cached_; }

  static constexpr int kClasses = 13;
  static constexpr size_t classBytes(int cls) {
    // 1, 1.5, 2, 3, 4, 6, ... 64 KiB.
    return (size_t{1024} << (cls / 2)) + ((cls % 2) ? (size_t{512} << (cls / 2)) : 0);
  }
  static int classOf(size_t bytes) {
    for (int c = 0; c < kClasses; ++c) {
      if (bytes <= classBytes(c)) return c;
    }
    return -1;
  }

 private:
  // A block: this header, room for the shared_ptr's control block, then the
  // buffer (kHead is a multiple of 16, so the buffer is aligned as malloc's).
  struct Block {
    Block* next;
    int cls;
  };
  static constexpr size_t kHeaderBytes = 16;
  static_assert(sizeof(Block) <= kHeaderBytes, "the header's room");
  static constexpr size_t kControlBytes = 64;
  static constexpr size_t kHead = kHeaderBytes + kControlBytes;

  struct Shared {
    std::atomic<Block*> returned{nullptr};
    ~Shared() {
      Block* b = returned.exchange(nullptr);
      while (b) std::free(std::exchange(b, b->next));
    }
    void give(Block* b) {
      Block* head = returned.load(std::memory_order_relaxed);
      do {
        b->next = head;
      } while (!returned.compare_exchange_weak(head, b, std::memory_order_release, std::memory_order_relaxed));
    }
  };

  // The allocator of a buffer's control block: the block's own room, and on
  // release the whole block goes back to the stack.
  template <class T>
  struct Placement {
    using value_type = T;
    std::shared_ptr<Shared> shared;
    Block* block;
    Placement(std::shared_ptr<Shared> s, Block* b) : shared(std::move(s)), block(b) {}
    template <class U>
    Placement(const Placement<U>& other) : shared(other.shared), block(other.block) {}
    T* allocate(size_t n) {
      static_assert(sizeof(T) <= kControlBytes && alignof(T) <= 16, "a control block that does not fit its room");
      if (n != 1) throw std::bad_alloc();
      return reinterpret_cast<T*>(reinterpret_cast<std::byte*>(block) + kHeaderBytes);
    }
    void deallocate(T*, size_t) { shared->give(block); }
    template <class U>
    bool operator==(const Placement<U>& o) const { return block == o.block; }
    template <class U>
    bool operator!=(const Placement<U>& o) const { return block != o.block; }
  };

  void takeReturned() {
    Block* b = shared_->returned.exchange(nullptr, std::memory_order_acquire);
    while (b) {
      Block* next = b->next;
      if (cached_ + classBytes(b->cls) <= kMaxCachedBytes) {
        b->next = free_[b->cls];
        free_[b->cls] = b;
        cached_ += classBytes(b->cls);
      } else {
        std::free(b);
      }
      b = next;
    }
  }

  std::shared_ptr<Shared> shared_;
  Block* free_[kClasses] = {};
  size_t cached_ = 0;
};

}  // namespace troupe::transport::internal
