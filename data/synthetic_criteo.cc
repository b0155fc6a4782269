#include "data/synthetic_criteo.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "common/hash.h"
#include "data/internal/binary_metrics.h"

namespace troupe::data {
namespace {

constexpr uint64_t kSplitSalt = 0x73706c6974ULL;  // "split"

struct Block {
  std::string text;
  int64_t clicks = 0;
  std::vector<double> p;       // test split only
  std::vector<uint8_t> labels;  // test split only
};

void makeBlock(const PlantedCriteoModel& model, int split, int64_t block, int64_t rows,
               bool keepP, Block* out) {
  const int T = model.tables();
  Rng rng(hashCombine(model.options().seed, kSplitSalt + uint64_t(split), uint64_t(block)));
  SyntheticRow row;
  out->text.clear();
  out->text.reserve(size_t(rows) * size_t(2 + 4 * kCriteoIntFeatures + 9 * T));
  out->clicks = 0;
  out->p.clear();
  out->labels.clear();
  if (keepP) {
    out->p.reserve(size_t(rows));
    out->labels.reserve(size_t(rows));
  }
  char line[64 * 1024];
  for (int64_t i = 0; i < rows; ++i) {
    model.sampleFeatures(rng, &row);
    const double p = PlantedCriteoModel::sigmoid(model.logit(row));
    const bool click = rng.uniform() < p;
    out->clicks += click;
    if (keepP) {
      out->p.push_back(p);
      out->labels.push_back(click);
    }
    char* w = line;
    *w++ = click ? '1' : '0';
    for (int j = 0; j < kCriteoIntFeatures; ++j) {
      *w++ = '\t';
      if (row.intPresent[j]) w = std::to_chars(w, line + sizeof(line), row.ints[j]).ptr;
    }
    for (int t = 0; t < T; ++t) {
      *w++ = '\t';
      if (row.ranks[size_t(t)] != 0) {
        model.writeToken(t, row.ranks[size_t(t)], w);
        w += 8;
      }
    }
    *w++ = '\n';
    out->text.append(line, size_t(w - line));
  }
}

Status writeAll(int fd, const std::string& path, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::ioError(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
    }
    done += size_t(n);
  }
  return Status::ok();
}

// A file written under path + ".tmp" and renamed to path by commit().
class PendingFile final {
 public:
  PendingFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {}
  ~PendingFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }
  Status open() {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return Status::ioError(fmt::format("cannot create '{}': {}", tmp_, std::strerror(errno)));
    return Status::ok();
  }
  Status write(const std::string& data) { return writeAll(fd_, tmp_, data); }
  Status commit() {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
      ::unlink(tmp_.c_str());
      return Status::ioError(fmt::format("cannot write '{}': {}", tmp_, std::strerror(errno)));
    }
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp_.c_str());
      return Status::ioError(fmt::format("cannot rename '{}' to '{}': {}", tmp_, path_, std::strerror(err)));
    }
    return Status::ok();
  }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
};

struct SplitResult {
  int64_t clicks = 0;
  std::vector<double> p;
  std::vector<uint8_t> labels;
};

Status writeSplit(const PlantedCriteoModel& model, int split, int64_t rows, const std::string& path,
                  ComputePool& pool, int64_t rowsBefore, int64_t rowsTotal,
                  const SyntheticProgress& progress, SplitResult* result) {
  const bool keepP = split == 1;
  PendingFile file(path);
  if (Status s = file.open(); !s) return s;
  const int64_t blockRows = model.options().blockRows;
  const int64_t blocks = (rows + blockRows - 1) / blockRows;
  const int64_t window = std::max(2, 2 * pool.threads());
  std::vector<Block> out(static_cast<size_t>(window));
  int64_t done = 0;
  for (int64_t first = 0; first < blocks; first += window) {
    const int64_t count = std::min(window, blocks - first);
    pool.parallelFor(count, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t b = first + i;
        makeBlock(model, split, b, std::min(blockRows, rows - b * blockRows), keepP, &out[size_t(i)]);
      }
    });
    for (int64_t i = 0; i < count; ++i) {
      Block& block = out[size_t(i)];
      if (Status s = file.write(block.text); !s) return s;
      result->clicks += block.clicks;
      if (keepP) {
        result->p.insert(result->p.end(), block.p.begin(), block.p.end());
        result->labels.insert(result->labels.end(), block.labels.begin(), block.labels.end());
      }
      done += std::min(blockRows, rows - (first + i) * blockRows);
    }
    if (progress) progress(rowsBefore + done, rowsTotal);
  }
  return file.commit();
}

Status writeText(const std::string& path, const std::string& text) {
  PendingFile file(path);
  if (Status s = file.open(); !s) return s;
  if (Status s = file.write(text); !s) return s;
  return file.commit();
}

std::string num(double x) { return fmt::format("{:.17g}", x); }

// The number after "key": in our own oracle.json.
std::optional<double> jsonNumber(const std::string& json, std::string_view key) {
  const std::string needle = fmt::format("\"{}\": ", key);
  const size_t at = json.find(needle);
  if (at == std::string::npos) return std::nullopt;
  const char* begin = json.c_str() + at + needle.size();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return v;
}

Expected<std::string> readText(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    const int err = errno;
    std::string msg = fmt::format("cannot open '{}': {}", path, std::strerror(err));
    return err == ENOENT ? Status::notFound(std::move(msg)) : Status::ioError(std::move(msg));
  }
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  std::fclose(f);
  return text;
}

}  // namespace

int64_t syntheticTestRows(const SyntheticCriteoOptions& options) {
  return options.testRows > 0 ? options.testRows : std::max<int64_t>(options.rows / 10, 1);
}

std::string syntheticOracleJson(const PlantedCriteoModel& model, const SyntheticCriteoOracle& r) {
  const auto& o = model.options();
  std::string vocab;
  for (int t = 0; t < model.tables(); ++t) {
    vocab += fmt::format("{}{}", t ? ", " : "", model.vocab(t));
  }
  return fmt::format(
      "{{\n"
      "  \"auc\": {},\n"
      "  \"logloss\": {},\n"
      "  \"train_rows\": {},\n"
      "  \"test_rows\": {},\n"
      "  \"ctr_train\": {},\n"
      "  \"ctr_test\": {},\n"
      "  \"mean_p_test\": {},\n"
      "  \"bias\": {},\n"
      "  \"seed\": {},\n"
      "  \"tables\": {},\n"
      "  \"min_vocab\": {},\n"
      "  \"max_vocab\": {},\n"
      "  \"zipf\": {},\n"
      "  \"factor_dim\": {},\n"
      "  \"target_ctr\": {},\n"
      "  \"weight_scale\": {},\n"
      "  \"factor_scale\": {},\n"
      "  \"dense_scale\": {},\n"
      "  \"rare_rank\": {},\n"
      "  \"rare_shrink\": {},\n"
      "  \"block_rows\": {},\n"
      "  \"pairs\": {},\n"
      "  \"vocab\": [{}]\n"
      "}}\n",
      num(r.auc), num(r.logloss), r.trainRows, r.testRows, num(r.ctrTrain), num(r.ctrTest),
      num(r.meanPTest), num(r.bias), o.seed, o.tables, o.minVocab, o.maxVocab, num(o.zipf),
      o.factorDim, num(o.ctr), num(o.weightScale), num(o.factorScale), num(o.denseScale),
      num(o.rareRank), num(o.rareShrink), o.blockRows, model.pairs().size(), vocab);
}

Expected<SyntheticCriteoOracle> generateSyntheticCriteo(const SyntheticCriteoOptions& options,
                                                        const std::string& dir, ComputePool& pool,
                                                        const SyntheticProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  const PlantedCriteoModel model(options);
  auto r = generateSyntheticCriteo(model, dir, pool, progress);
  if (r) r->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

Expected<SyntheticCriteoOracle> generateSyntheticCriteo(const PlantedCriteoModel& model,
                                                        const std::string& dir, ComputePool& pool,
                                                        const SyntheticProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  const SyntheticCriteoOptions& options = model.options();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::ioError(fmt::format("cannot create directory '{}': {}", dir, ec.message()));
  const std::string oraclePath = dir + "/" + kSyntheticOracleFile;
  if (::unlink(oraclePath.c_str()) != 0 && errno != ENOENT) {
    return Status::ioError(fmt::format("cannot remove '{}': {}", oraclePath, std::strerror(errno)));
  }

  SyntheticCriteoOracle r;
  r.trainRows = options.rows;
  r.testRows = syntheticTestRows(options);
  const int64_t total = r.trainRows + r.testRows;
  SplitResult train, test;
  if (Status s = writeSplit(model, 0, r.trainRows, dir + "/" + kSyntheticTrainFile, pool, 0, total,
                            progress, &train);
      !s) {
    return s;
  }
  if (Status s = writeSplit(model, 1, r.testRows, dir + "/" + kSyntheticTestFile, pool, r.trainRows,
                            total, progress, &test);
      !s) {
    return s;
  }
  r.ctrTrain = double(train.clicks) / double(r.trainRows);
  r.ctrTest = double(test.clicks) / double(r.testRows);
  double sumP = 0;
  for (double p : test.p) sumP += p;
  r.meanPTest = sumP / double(r.testRows);
  r.auc = internal::rocAuc(test.p, test.labels);
  r.logloss = internal::logLoss(test.p, test.labels);
  r.bias = model.bias();
  if (Status s = writeText(oraclePath, syntheticOracleJson(model, r)); !s) return s;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

Expected<SyntheticCriteoOracle> readSyntheticOracle(const std::string& dir) {
  const std::string path = dir + "/" + kSyntheticOracleFile;
  auto text = readText(path);
  if (!text) return text.status();
  SyntheticCriteoOracle r;
  const std::pair<const char*, double*> doubles[] = {
      {"auc", &r.auc},           {"logloss", &r.logloss}, {"ctr_train", &r.ctrTrain},
      {"ctr_test", &r.ctrTest}, {"mean_p_test", &r.meanPTest}, {"bias", &r.bias}};
  for (const auto& [key, out] : doubles) {
    auto v = jsonNumber(*text, key);
    if (!v) return Status::corruption(fmt::format("'{}': no number \"{}\"", path, key));
    *out = *v;
  }
  auto train = jsonNumber(*text, "train_rows");
  auto test = jsonNumber(*text, "test_rows");
  if (!train || !test) return Status::corruption(fmt::format("'{}': no row counts", path));
  r.trainRows = int64_t(*train);
  r.testRows = int64_t(*test);
  return r;
}

bool syntheticCriteoMatches(const SyntheticCriteoOptions& o, const std::string& dir) {
  auto text = readText(dir + "/" + kSyntheticOracleFile);
  if (!text) return false;
  const std::pair<const char*, double> expected[] = {
      {"train_rows", double(o.rows)},     {"test_rows", double(syntheticTestRows(o))},
      {"seed", double(o.seed)},           {"tables", double(o.tables)},
      {"min_vocab", double(o.minVocab)},  {"max_vocab", double(o.maxVocab)},
      {"zipf", o.zipf},                   {"factor_dim", double(o.factorDim)},
      {"target_ctr", o.ctr},              {"weight_scale", o.weightScale},
      {"factor_scale", o.factorScale},    {"dense_scale", o.denseScale},
      {"rare_rank", o.rareRank},          {"rare_shrink", o.rareShrink},
      {"block_rows", double(o.blockRows)}};
  for (const auto& [key, value] : expected) {
    auto v = jsonNumber(*text, key);
    if (!v || *v != value) return false;
  }
  // seed is a uint64: compare its exact text too (a double holds 53 bits).
  if (text->find(fmt::format("\"seed\": {},", o.seed)) == std::string::npos) return false;
  std::error_code ec;
  return std::filesystem::is_regular_file(dir + "/" + kSyntheticTrainFile, ec) &&
         std::filesystem::is_regular_file(dir + "/" + kSyntheticTestFile, ec);
}

std::string describeSyntheticCriteo(const SyntheticCriteoOptions& options) {
  return PlantedCriteoModel(options).summary();
}

}  // namespace troupe::data
