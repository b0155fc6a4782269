#include "workers/residual_image.h"

#include <unordered_set>

#include <fmt/format.h>

#include "common/checksum_file.h"

namespace troupe::workers {
namespace {

constexpr uint32_t kVersion = 1;

}  // namespace

std::string residualFileName(int64_t rank) { return fmt::format("residuals-{}.ckpt", rank); }

Status writeResidualImage(const ResidualImage& img, const std::string& path, uint64_t* checksum, uint64_t* bytes) {
  auto w = ChecksumWriter::create(path, kResidualImageMagic);
  if (!w.hasValue()) return w.status();
  w->put(kVersion);
  w->put(img.worker);
  w->put(img.step);
  w->put(img.pushCodec);
  w->put(img.allreduceCodec);
  w->put(uint64_t(img.pushDense.size()));
  for (const auto& d : img.pushDense) w->putVector(d);
  w->put(uint64_t(img.pushRows.size()));
  for (const auto& t : img.pushRows) {
    w->putVector(t.keys);
    w->putVector(t.values);
  }
  w->put(uint64_t(img.allreduce.size()));
  for (const auto& t : img.allreduce) {
    w->put(t.key);
    w->put(t.count);
    w->put(t.size);
    w->put(t.rank);
    w->putVector(t.residual);
    w->putVector(t.owned);
  }
  return w->finish(checksum, bytes);
}

Expected<ResidualImage> readResidualImage(const std::string& path) {
  auto r = ChecksumReader::open(path, kResidualImageMagic);
  if (!r.hasValue()) return r.status();
  auto version = r->get<uint32_t>("version");
  if (!version.hasValue()) return version.status();
  if (*version != kVersion) return r->corrupt("version", fmt::format("is {}, this troupe reads {}", *version, kVersion));
  ResidualImage img;
  auto worker = r->get<int64_t>("header");
  if (!worker.hasValue()) return worker.status();
  auto step = r->get<int64_t>("header");
  if (!step.hasValue()) return step.status();
  img.worker = *worker;
  img.step = *step;
  auto push = r->get<uint8_t>("header");
  if (!push.hasValue()) return push.status();
  auto reduce = r->get<uint8_t>("header");
  if (!reduce.hasValue()) return reduce.status();
  img.pushCodec = *push;
  img.allreduceCodec = *reduce;
  constexpr uint8_t kKinds = uint8_t(kernels::CodecKind::kRandomK);
  if (img.worker < 0 || img.step < 0 || img.pushCodec > kKinds || img.allreduceCodec > kKinds) {
    return r->corrupt("header", fmt::format("says worker {} at step {}, codecs {} and {}", img.worker, img.step,
                                            img.pushCodec, img.allreduceCodec));
  }
  // A count of parts, each taking at least `bytes` of what is left (no
  // allocation beyond what the file can hold).
  auto count = [&](const char* what, size_t bytes) -> Expected<uint64_t> {
    auto n = r->get<uint64_t>(what);
    if (!n.hasValue()) return n.status();
    if (*n > r->left() / bytes) return r->corrupt(what, fmt::format("claims {} parts, more than the file holds", *n));
    return *n;
  };
  auto shards = count("push dense residuals", 8);
  if (!shards.hasValue()) return shards.status();
  img.pushDense.resize(size_t(*shards));
  for (auto& d : img.pushDense) {
    if (Status s = r->getVector(&d, r->left() / 4, "push dense residual"); !s.isOk()) return s;
  }
  auto tables = count("push residual rows", 16);
  if (!tables.hasValue()) return tables.status();
  img.pushRows.resize(size_t(*tables));
  for (auto& t : img.pushRows) {
    if (Status s = r->getVector(&t.keys, r->left() / 8, "push residual keys"); !s.isOk()) return s;
    if (Status s = r->getVector(&t.values, r->left() / 4, "push residual rows"); !s.isOk()) return s;
  }
  auto tensors = count("all-reduce residuals", 36);
  if (!tensors.hasValue()) return tensors.status();
  img.allreduce.resize(size_t(*tensors));
  for (auto& t : img.allreduce) {
    auto key = r->get<int32_t>("all-reduce tensor");
    if (!key.hasValue()) return key.status();
    auto n = r->get<int64_t>("all-reduce tensor");
    if (!n.hasValue()) return n.status();
    auto size = r->get<int32_t>("all-reduce tensor");
    if (!size.hasValue()) return size.status();
    auto rank = r->get<int32_t>("all-reduce tensor");
    if (!rank.hasValue()) return rank.status();
    t.key = *key;
    t.count = *n;
    t.size = *size;
    t.rank = *rank;
    if (Status s = r->getVector(&t.residual, r->left() / 4, "all-reduce residual"); !s.isOk()) return s;
    if (Status s = r->getVector(&t.owned, r->left() / 4, "all-reduce owner's residual"); !s.isOk()) return s;
  }
  if (Status s = r->finish(); !s.isOk()) return s;
  return img;
}

Status checkResidualImage(const ResidualImage& img, const std::string& path, int64_t rank, int64_t step,
                          const std::vector<int64_t>& dims, const std::vector<int64_t>& denseSlices) {
  auto wrong = [&](const std::string& what) { return Status::invalidArgument(fmt::format("{}: {}", path, what)); };
  if (img.worker != rank) return wrong(fmt::format("holds worker {}'s residuals, not worker {}'s", img.worker, rank));
  if (img.step != step) return wrong(fmt::format("holds the residuals of step {}; the worker resumes at {}", img.step, step));
  if (!img.pushDense.empty() && img.pushDense.size() != denseSlices.size()) {
    return wrong(fmt::format("holds dense residuals for {} shards; this job has {}", img.pushDense.size(),
                             denseSlices.size()));
  }
  for (size_t s = 0; s < img.pushDense.size(); ++s) {
    if (!img.pushDense[s].empty() && int64_t(img.pushDense[s].size()) != denseSlices[s]) {
      return wrong(fmt::format("holds {} dense residuals for shard {}, whose slice is {}", img.pushDense[s].size(), s,
                               denseSlices[s]));
    }
  }
  if (!img.pushRows.empty() && img.pushRows.size() != dims.size()) {
    return wrong(fmt::format("holds residual rows of {} tables; this job has {}", img.pushRows.size(), dims.size()));
  }
  for (size_t t = 0; t < img.pushRows.size(); ++t) {
    const auto& rows = img.pushRows[t];
    if (rows.values.size() != rows.keys.size() * size_t(dims[t])) {
      return wrong(fmt::format("holds {} residual floats for {} keys of table {} (dim {})", rows.values.size(),
                               rows.keys.size(), t, dims[t]));
    }
    std::unordered_set<uint64_t> seen(rows.keys.begin(), rows.keys.end());
    if (seen.size() != rows.keys.size()) return wrong(fmt::format("holds a key of table {} twice", t));
  }
  return Status::ok();
}

}  // namespace troupe::workers
