// Files that are whole or refused (checkpoints): written to a temporary name,
// checksummed (XXH3-64, Debian's libxxhash), fsynced and renamed into place,
// so a reader sees the old file, the new one, or none, never half of one;
// read whole, their magic and checksum verified before a byte is used, and
// parsed with every length bounds-checked. Every error names the file and
// what is wrong with it.
//
//   [8 bytes magic][payload ...][8 bytes XXH3-64 of magic + payload]
//
// Threading: one owner per object.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace troupe {

// XXH3-64 of bytes (for manifests and checks).
uint64_t xxh3(const void* data, size_t bytes);

class ChecksumWriter final {
 public:
  // Opens `path` + ".tmp" for writing; `magic` is exactly 8 characters.
  static Expected<ChecksumWriter> create(const std::string& path, std::string_view magic);
  ChecksumWriter(ChecksumWriter&& other) noexcept;
  ChecksumWriter& operator=(ChecksumWriter&&) = delete;
  ~ChecksumWriter();  // an unfinished file is removed

  void put(const void* data, size_t bytes);
  template <class T>
  void put(const T& x) {
    static_assert(std::is_trivially_copyable_v<T>);
    put(&x, sizeof(T));
  }
  template <class T>
  void putVector(const std::vector<T>& v) {
    put(uint64_t(v.size()));
    if (!v.empty()) put(v.data(), v.size() * sizeof(T));
  }
  void putString(const std::string& s);

  // Writes the checksum, fsyncs, renames over `path` and fsyncs the
  // directory. The file's checksum and size, when asked for.
  Status finish(uint64_t* checksum = nullptr, uint64_t* bytes = nullptr);

 private:
  ChecksumWriter(std::string path, std::FILE* file, void* state);
  std::string path_;
  std::FILE* file_ = nullptr;
  void* state_ = nullptr;  // XXH3_state_t
  uint64_t bytes_ = 0;
  bool failed_ = false;
};

class ChecksumReader final {
 public:
  // Reads `path` whole and verifies its magic and checksum.
  static Expected<ChecksumReader> open(const std::string& path, std::string_view magic);

  // Each fails, naming the file and `what`, when the payload runs out.
  Status get(void* out, size_t bytes, const char* what);
  template <class T>
  Expected<T> get(const char* what) {
    static_assert(std::is_trivially_copyable_v<T>);
    T x;
    Status s = get(&x, sizeof(T), what);
    if (!s.isOk()) return s;
    return x;
  }
  // A vector stored by putVector, of at most `maxCount` elements.
  template <class T>
  Status getVector(std::vector<T>* out, uint64_t maxCount, const char* what) {
    auto n = get<uint64_t>(what);
    if (!n.hasValue()) return n.status();
    if (*n > maxCount || *n > left() / sizeof(T)) {
      return corrupt(what, "claims " + std::to_string(*n) + " elements, more than the file holds");
    }
    out->resize(size_t(*n));
    return *n ? get(out->data(), size_t(*n) * sizeof(T), what) : Status::ok();
  }
  Status getString(std::string* out, const char* what);
  // The payload is used up (a file with bytes left over is refused).
  Status finish() const;

  size_t left() const { return end_ - at_; }
  const std::string& path() const { return path_; }
  uint64_t checksum() const { return checksum_; }
  uint64_t bytes() const { return data_.size(); }
  Status corrupt(const char* what, const std::string& how) const;

 private:
  std::string path_;
  std::vector<char> data_;
  size_t at_ = 0, end_ = 0;
  uint64_t checksum_ = 0;
};

}  // namespace troupe
