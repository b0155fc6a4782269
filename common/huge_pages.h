// Memory for large tables on transparent huge pages. Lookups of random rows
// in a table far larger than the caches (an embedding table's hash slots
// and rows) miss the TLB on nearly every access with 4 KiB pages; with
// 2 MiB pages the same lookups walk far fewer page tables. TableMemory
// asked for `huge` maps its bytes 2 MiB-aligned and asks the kernel for
// huge pages over them (madvise MADV_HUGEPAGE, before anything touches
// them): where transparent huge pages are "always" or "madvise" the kernel
// backs them with huge pages when it has some, and elsewhere they are
// ordinary memory. Otherwise it is ordinary 64-byte-aligned memory.
// Measured (bench/RESULTS.md, troupe_kernels_bench TablePull): faster only
// for tables of hundreds of MiB and more, so an embedding table asks for it
// once it is EmbeddingTableOptions::hugePagesFromBytes large.
//
// Threading: a TableMemory is used by one owner at a time; the functions
// are safe from any thread.
#pragma once

#include <cstddef>
#include <string>

namespace troupe {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

class TableMemory final {
 public:
  TableMemory() = default;
  // Uninitialised bytes (at least one); throws std::bad_alloc.
  TableMemory(size_t bytes, bool huge);
  ~TableMemory();
  TableMemory(TableMemory&& o) noexcept;
  TableMemory& operator=(TableMemory&& o) noexcept;
  TableMemory(const TableMemory&) = delete;
  TableMemory& operator=(const TableMemory&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool huge() const { return huge_; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool huge_ = false;
};

// The kernel's transparent huge page mode: the bracketed word of
// /sys/kernel/mm/transparent_hugepage/enabled ("always", "madvise",
// "never"), or "unavailable" where the file is missing or unreadable.
std::string transparentHugePages();
// The bracketed word of that file's text; "unavailable" if there is none.
std::string parseTransparentHugePageMode(const std::string& text);

}  // namespace troupe
