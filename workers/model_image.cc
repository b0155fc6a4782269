#include "workers/model_image.h"

#include <fmt/format.h>

#include "common/checksum_file.h"
#include "ps/shard_image.h"

namespace troupe::workers {
namespace {

constexpr uint32_t kVersion = 1;
constexpr int64_t kMaxWorkers = 1 << 16;

}  // namespace

Status writeModelImage(const ModelImage& img, const std::string& path, uint64_t* checksum, uint64_t* bytes) {
  auto w = ChecksumWriter::create(path, kModelImageMagic);
  if (!w.hasValue()) return w.status();
  w->put(kVersion);
  for (int64_t x : {img.workers, img.step, img.epoch, img.epochBatch, img.samplesApplied, img.denseParameters}) {
    w->put(x);
  }
  w->putVector(img.dense);
  static const std::vector<ps::TableImage> kNone;
  ps::putTables(*w, img.tables ? *img.tables : kNone);  // no copy of the tables
  return w->finish(checksum, bytes);
}

Expected<ModelImage> readModelImage(const std::string& path) {
  auto r = ChecksumReader::open(path, kModelImageMagic);
  if (!r.hasValue()) return r.status();
  auto version = r->get<uint32_t>("version");
  if (!version.hasValue()) return version.status();
  if (*version != kVersion) return r->corrupt("version", fmt::format("is {}, this troupe reads {}", *version, kVersion));
  ModelImage img;
  for (int64_t* x : {&img.workers, &img.step, &img.epoch, &img.epochBatch, &img.samplesApplied, &img.denseParameters}) {
    auto v = r->get<int64_t>("header");
    if (!v.hasValue()) return v.status();
    *x = *v;
  }
  if (img.workers < 1 || img.workers > kMaxWorkers || img.step < 0 || img.epoch < 0 || img.epochBatch < 0 ||
      img.samplesApplied < 0 || img.denseParameters < 0) {
    return r->corrupt("header", fmt::format("says {} workers at step {} (epoch {}, from its batch {}), {} samples, {} "
                                            "dense weights",
                                            img.workers, img.step, img.epoch, img.epochBatch, img.samplesApplied,
                                            img.denseParameters));
  }
  if (Status s = r->getVector(&img.dense, r->left() / 4, "dense state"); !s.isOk()) return s;
  if (img.dense.size() < size_t(img.denseParameters)) {
    return r->corrupt("dense state", fmt::format("has {} floats for {} weights", img.dense.size(), img.denseParameters));
  }
  auto tables = std::make_shared<std::vector<ps::TableImage>>();
  if (Status s = ps::getTables(*r, tables.get()); !s.isOk()) return s;
  img.tables = std::move(tables);
  if (Status s = r->finish(); !s.isOk()) return s;
  return img;
}

Status checkModelImage(const ModelImage& img, const std::string& path, int64_t workers, int64_t denseParameters,
                       int64_t denseStateFloats, int64_t tables) {
  auto differs = [&](const char* what, auto has, auto wants) {
    return Status::invalidArgument(fmt::format("{}: holds {} {}; this job has {}", path, has, what, wants));
  };
  if (img.workers != workers) return differs("workers", img.workers, workers);
  if (img.denseParameters != denseParameters) return differs("dense weights", img.denseParameters, denseParameters);
  if (int64_t(img.dense.size()) != denseStateFloats) {
    return differs("floats of dense state (weights and optimizer)", img.dense.size(), denseStateFloats);
  }
  if (int64_t(img.tableCount()) != tables) return differs("embedding tables", img.tableCount(), tables);
  return Status::ok();
}

}  // namespace troupe::workers
