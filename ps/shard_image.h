// A shard's state at a consistent cut, as its checkpoint file holds it: every
// table's rows with their optimizer state, the dense slice with its
// optimizer state, the optimizer's step counter, which pushes of every worker
// it has applied (and so where each worker resumes), and its ledger. Written
// with common/checksum_file.h (temporary name, XXH3, fsync, rename); read
// whole and refused, naming the file and what is wrong, when it is truncated,
// corrupt or not what this shard expects.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "ps/embedding_table.h"

namespace troupe {
class ChecksumWriter;
class ChecksumReader;
}

namespace troupe::ps {

inline constexpr const char* kShardImageMagic = "TRPSHRD1";

struct WorkerCut {
  int64_t floor = 0;            // every push below applied
  std::vector<int64_t> early;   // applied above the floor (out of order)
  int64_t clock = 0;            // steps applied (consistency clock)
  bool live = true;             // still training
};

struct ShardImage {
  int64_t shard = 0, shards = 1, workers = 1;
  int64_t consistency = 0;   // ps::Consistency
  int64_t updates = 0;       // optimizer steps applied
  std::vector<TableImage> tables;
  int64_t denseSize = 0;     // dense weights of the slice
  std::vector<float> dense;  // [weights | optimizer state]
  std::vector<WorkerCut> workerCut;
  int64_t samplesApplied = 0, pushesApplied = 0, duplicatePushes = 0;
};

// Writes the image to `path` (whole or not at all). Its checksum and size
// when asked for.
Status writeShardImage(const ShardImage& image, const std::string& path, uint64_t* checksum = nullptr,
                       uint64_t* bytes = nullptr);
// Reads and verifies it (checksum, every length, the sizes that must agree).
Expected<ShardImage> readShardImage(const std::string& path);

// The tables part of an image file (shard images, and the model image of a
// sync-mode checkpoint): a count, then each table's header, keys and rows.
void putTables(ChecksumWriter& w, const std::vector<TableImage>& tables);
// Reads what putTables wrote, every length bounded by what the file holds.
Status getTables(ChecksumReader& r, std::vector<TableImage>* out);

}  // namespace troupe::ps
