// Cap'n Proto without a heap allocation per message, for the frame and
// actor-message codecs (private to transport/):
// - ScratchBuilder: a message builder whose first segment is this thread's
//   reusable scratch (zeroed; Cap'n Proto zeroes again what it used when the
//   builder goes), instead of a calloc per message. A second builder alive
//   on the same thread, or a message larger than the scratch, falls back to
//   the allocator.
// - flatBytes / writeFlat: the message in Cap'n Proto's flat form written
//   straight into the caller's buffer, instead of into an array of its own
//   that is then copied.
// - WordsOf: a received message read where it lies when it is word
//   aligned (frames and bodies in the node's buffers always are), copied to
//   aligned storage otherwise.
//
// Threading: ScratchBuilder uses thread-local storage; the rest are plain
// functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

#include <capnp/message.h>
#include <kj/array.h>

namespace troupe::transport::internal {

class ScratchBuilder {
 public:
  // Scratch per thread; envelopes and actor-message bodies are far smaller.
  static constexpr unsigned kScratchWords = 1024;
  // Segment size when the scratch is taken (as before it existed).
  static constexpr unsigned kFallbackWords = 64;

  ScratchBuilder() {
    Scratch& s = scratch();
    if (!s.busy) {
      s.busy = true;
      owns_ = true;
      builder_.emplace(kj::arrayPtr(s.words, kScratchWords));
    } else {
      builder_.emplace(kFallbackWords);
    }
  }
  ~ScratchBuilder() {
    builder_.reset();  // zeroes what it used of the scratch
    if (owns_) scratch().busy = false;
  }
  ScratchBuilder(const ScratchBuilder&) = delete;
  ScratchBuilder& operator=(const ScratchBuilder&) = delete;

  capnp::MessageBuilder& get() { return *builder_; }

 private:
  struct Scratch {
    bool busy = false;
    capnp::word words[kScratchWords] = {};
  };
  static Scratch& scratch() {
    static thread_local Scratch s;
    return s;
  }

  bool owns_ = false;
  std::optional<capnp::MallocMessageBuilder> builder_;
};

// Bytes of the flat form of `message`: the segment table (a u32 count - 1,
// a u32 size per segment, padded to a word), then the segments.
inline size_t flatBytes(capnp::MessageBuilder& message) {
  auto segments = message.getSegmentsForOutput();
  size_t words = segments.size() / 2 + 1;
  for (auto s : segments) words += s.size();
  return words * sizeof(capnp::word);
}

// Writes that flat form to `out` (flatBytes(message) bytes; any alignment).
inline void writeFlat(capnp::MessageBuilder& message, std::byte* out) {
  auto segments = message.getSegmentsForOutput();
  const size_t tableWords = segments.size() / 2 + 1;
  std::memset(out, 0, tableWords * sizeof(capnp::word));
  auto put32 = [&](size_t index, uint32_t v) {
    for (size_t i = 0; i < 4; ++i) out[4 * index + i] = std::byte((v >> (8 * i)) & 0xff);
  };
  put32(0, uint32_t(segments.size() - 1));
  for (size_t i = 0; i < segments.size(); ++i) put32(i + 1, uint32_t(segments[i].size()));
  std::byte* p = out + tableWords * sizeof(capnp::word);
  for (auto s : segments) {
    std::memcpy(p, s.begin(), s.size() * sizeof(capnp::word));
    p += s.size() * sizeof(capnp::word);
  }
}

// `bytes` bytes at `data` (a multiple of 8) as words for a reader: in place
// when word aligned, else a copy this object owns.
class WordsOf {
 public:
  WordsOf(const void* data, size_t bytes) {
    const size_t n = bytes / sizeof(capnp::word);
    if (reinterpret_cast<uintptr_t>(data) % alignof(capnp::word) == 0) {
      words_ = kj::arrayPtr(static_cast<const capnp::word*>(data), n);
    } else {
      copy_ = kj::heapArray<capnp::word>(n);
      std::memcpy(copy_.begin(), data, n * sizeof(capnp::word));
      words_ = copy_.asPtr();
    }
  }
  kj::ArrayPtr<const capnp::word> get() const { return words_; }

 private:
  kj::Array<capnp::word> copy_;
  kj::ArrayPtr<const capnp::word> words_;
};

}  // namespace troupe::transport::internal
