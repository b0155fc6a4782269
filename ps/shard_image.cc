#include "ps/shard_image.h"

#include <fmt/format.h>

#include "common/checksum_file.h"

namespace troupe::ps {
namespace {

constexpr uint32_t kVersion = 1;
// Bounds on what a file may claim (a hostile or corrupt file is refused
// before it makes this process allocate what it says).
constexpr uint64_t kMaxTables = 4096;
constexpr uint64_t kMaxWorkers = 1 << 16;

}  // namespace

void putTables(ChecksumWriter& w, const std::vector<TableImage>& tables) {
  w.put(uint64_t(tables.size()));
  for (const auto& t : tables) {
    for (int64_t x : {t.tableId, t.dim, t.rowFloats, t.optimizerKind}) w.put(x);
    w.putVector(t.keys);
    w.putVector(t.rows);
  }
}

Status getTables(ChecksumReader& r, std::vector<TableImage>* out) {
  auto tables = r.get<uint64_t>("table count");
  if (!tables.hasValue()) return tables.status();
  if (*tables > kMaxTables) return r.corrupt("table count", fmt::format("is {}", *tables));
  out->assign(size_t(*tables), TableImage{});
  for (auto& t : *out) {
    for (int64_t* x : {&t.tableId, &t.dim, &t.rowFloats, &t.optimizerKind}) {
      auto v = r.get<int64_t>("table header");
      if (!v.hasValue()) return v.status();
      *x = *v;
    }
    if (t.dim < 1 || t.rowFloats < t.dim) {
      return r.corrupt("table header", fmt::format("table {}: dim {}, {} floats a row", t.tableId, t.dim, t.rowFloats));
    }
    if (Status s = r.getVector(&t.keys, r.left() / 8, "table keys"); !s.isOk()) return s;
    if (Status s = r.getVector(&t.rows, r.left() / 4, "table rows"); !s.isOk()) return s;
    if (t.rows.size() != t.keys.size() * size_t(t.rowFloats)) {
      return r.corrupt("table rows", fmt::format("table {}: {} floats for {} keys of {} floats", t.tableId,
                                                 t.rows.size(), t.keys.size(), t.rowFloats));
    }
  }
  return Status::ok();
}

Status writeShardImage(const ShardImage& img, const std::string& path, uint64_t* checksum, uint64_t* bytes) {
  auto w = ChecksumWriter::create(path, kShardImageMagic);
  if (!w.hasValue()) return w.status();
  w->put(kVersion);
  for (int64_t x : {img.shard, img.shards, img.workers, img.consistency, img.updates, img.denseSize,
                    img.samplesApplied, img.pushesApplied, img.duplicatePushes}) {
    w->put(x);
  }
  w->putVector(img.dense);
  w->put(uint64_t(img.workerCut.size()));
  for (const auto& c : img.workerCut) {
    w->put(c.floor);
    w->put(c.clock);
    w->put(uint8_t(c.live));
    w->putVector(c.early);
  }
  putTables(*w, img.tables);
  return w->finish(checksum, bytes);
}

Expected<ShardImage> readShardImage(const std::string& path) {
  auto r = ChecksumReader::open(path, kShardImageMagic);
  if (!r.hasValue()) return r.status();
  auto version = r->get<uint32_t>("version");
  if (!version.hasValue()) return version.status();
  if (*version != kVersion) return r->corrupt("version", fmt::format("is {}, this troupe reads {}", *version, kVersion));
  ShardImage img;
  for (int64_t* x : {&img.shard, &img.shards, &img.workers, &img.consistency, &img.updates, &img.denseSize,
                     &img.samplesApplied, &img.pushesApplied, &img.duplicatePushes}) {
    auto v = r->get<int64_t>("header");
    if (!v.hasValue()) return v.status();
    *x = *v;
  }
  if (img.shards < 1 || img.shard < 0 || img.shard >= img.shards || img.workers < 1 ||
      uint64_t(img.workers) > kMaxWorkers || img.denseSize < 0) {
    return r->corrupt("header", fmt::format("says shard {} of {}, {} workers, {} dense weights", img.shard,
                                            img.shards, img.workers, img.denseSize));
  }
  if (Status s = r->getVector(&img.dense, r->left(), "dense slice"); !s.isOk()) return s;
  if (img.dense.size() < size_t(img.denseSize)) {
    return r->corrupt("dense slice", fmt::format("has {} floats for {} weights", img.dense.size(), img.denseSize));
  }
  auto workers = r->get<uint64_t>("worker count");
  if (!workers.hasValue()) return workers.status();
  if (*workers != uint64_t(img.workers)) {
    return r->corrupt("worker cut", fmt::format("names {} workers, the header {}", *workers, img.workers));
  }
  img.workerCut.resize(size_t(*workers));
  for (auto& c : img.workerCut) {
    auto floor = r->get<int64_t>("worker cut");
    auto clock = r->get<int64_t>("worker cut");
    auto live = r->get<uint8_t>("worker cut");
    if (!floor.hasValue() || !clock.hasValue() || !live.hasValue()) return r->corrupt("worker cut", "is truncated");
    c.floor = *floor;
    c.clock = *clock;
    c.live = *live != 0;
    if (Status s = r->getVector(&c.early, r->left(), "worker cut"); !s.isOk()) return s;
    if (c.floor < 0 || c.clock < 0) return r->corrupt("worker cut", fmt::format("at floor {}, clock {}", c.floor, c.clock));
  }
  if (Status s = getTables(*r, &img.tables); !s.isOk()) return s;
  if (Status s = r->finish(); !s.isOk()) return s;
  return img;
}

}  // namespace troupe::ps
