// Tensor: a typed byte buffer that travels inside actor messages and across
// processes as a raw buffer beside the envelope (never as a list of numbers).
//
// Ownership: a Tensor shares ownership of its bytes through `owner`; copies
// are cheap and point at the same bytes. A tensor received from the network
// points into the received frame, which stays alive while any tensor of it
// does (zero copy on receive). Bytes are read-only once sent.
//
// Threading: immutable after construction; safe to share between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>

#include "transport/buffer_pool.h"
#include "transport/frame.h"

namespace troupe::transport {

struct Tensor {
  std::shared_ptr<const void> owner;  // keeps `data` alive
  const std::byte* data = nullptr;
  uint64_t bytes = 0;
  DType dtype = DType::kBytes;

  // A tensor owning a copy of `n` bytes at `src`.
  static Tensor copyOf(const void* src, uint64_t n, DType dtype = DType::kBytes) {
    auto storage = std::make_shared<std::vector<std::byte>>(n);
    if (n) std::memcpy(storage->data(), src, n);
    Tensor t;
    t.data = storage->data();
    t.owner = std::move(storage);
    t.bytes = n;
    t.dtype = dtype;
    return t;
  }

  // A tensor that takes over `storage` (no copy).
  template <class T>
  static Tensor adopt(std::vector<T> storage, DType dtype) {
    auto holder = std::make_shared<std::vector<T>>(std::move(storage));
    Tensor t;
    t.data = reinterpret_cast<const std::byte*>(holder->data());
    t.bytes = holder->size() * sizeof(T);
    t.owner = std::move(holder);
    t.dtype = dtype;
    return t;
  }

  // A tensor of `n` bytes from `pool` (back to it when the last copy dies),
  // not zeroed: the caller writes them through `*out` before sending it.
  // Null `data` (and `*out`) when out of memory.
  static Tensor fromPool(BufferPool& pool, uint64_t n, DType dtype, std::byte** out) {
    Tensor t;
    std::shared_ptr<uint64_t[]> storage = pool.get(size_t(n));
    *out = reinterpret_cast<std::byte*>(storage.get());
    if (!storage) return t;
    t.data = *out;
    t.owner = std::move(storage);
    t.bytes = n;
    t.dtype = dtype;
    return t;
  }

  template <class T>
  const T* as() const { return reinterpret_cast<const T*>(data); }
  template <class T>
  size_t count() const { return size_t(bytes / sizeof(T)); }
};

// "Tensor(f32, 1024 bytes)": for logs (CAF's to_string of a message finds it).
std::string to_string(const Tensor& t);

}  // namespace troupe::transport

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::transport::Tensor)
