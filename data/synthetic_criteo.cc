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
#include <limits>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

// The oracle.json at path, parsed into *out: notFound / ioError when it
// cannot be read, corruption naming the file when it is not a JSON object.
Status readOracleJson(const std::string& path, nlohmann::json* out) {
  auto text = readText(path);
  if (!text) return text.status();
  try {
    *out = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    return Status::corruption(fmt::format("'{}': not JSON: {}", path, e.what()));
  }
  if (!out->is_object()) return Status::corruption(fmt::format("'{}': not a JSON object", path));
  return Status::ok();
}

// json[key] as a number into *out (null, a figure that was not finite,
// reads as NaN); corruption naming the file and the key when it is missing
// or not a number.
Status oracleNumber(const nlohmann::json& json, const std::string& path, const char* key, double* out) {
  const auto it = json.find(key);
  if (it == json.end()) return Status::corruption(fmt::format("'{}': no \"{}\"", path, key));
  if (it->is_null()) {
    *out = std::numeric_limits<double>::quiet_NaN();
    return Status::ok();
  }
  if (!it->is_number()) {
    return Status::corruption(fmt::format("'{}': \"{}\" is a {}, not a number", path, key, it->type_name()));
  }
  *out = it->get<double>();
  return Status::ok();
}

// json[key] as a whole number into *out; corruption naming the file and the
// key when it is missing or not a whole number.
Status oracleCount(const nlohmann::json& json, const std::string& path, const char* key, int64_t* out) {
  const auto it = json.find(key);
  if (it == json.end()) return Status::corruption(fmt::format("'{}': no \"{}\"", path, key));
  if (!it->is_number_integer()) {
    return Status::corruption(fmt::format("'{}': \"{}\" is a {}, not a whole number", path, key, it->type_name()));
  }
  *out = it->get<int64_t>();
  return Status::ok();
}

// Whether json[key] holds exactly `value` (a whole number for an integer
// option, the seed's 64 bits included).
template <typename T>
bool oracleHolds(const nlohmann::json& json, const char* key, T value) {
  const auto it = json.find(key);
  if (it == json.end()) return false;
  if constexpr (std::is_floating_point_v<T>) {
    return it->is_number() && it->get<double>() == value;
  } else if constexpr (std::is_unsigned_v<T>) {
    return it->is_number_unsigned() && it->get<uint64_t>() == value;
  } else {
    return it->is_number_integer() && it->get<int64_t>() == int64_t(value);
  }
}

// The figures of a parsed oracle.json into *r.
Status oracleFrom(const nlohmann::json& json, const std::string& path, SyntheticCriteoOracle* r) {
  const std::pair<const char*, double*> numbers[] = {
      {"auc", &r->auc},           {"logloss", &r->logloss},       {"ctr_train", &r->ctrTrain},
      {"ctr_test", &r->ctrTest}, {"mean_p_test", &r->meanPTest}, {"bias", &r->bias}};
  for (const auto& [key, out] : numbers) {
    if (Status s = oracleNumber(json, path, key, out); !s) return s;
  }
  if (Status s = oracleCount(json, path, "train_rows", &r->trainRows); !s) return s;
  return oracleCount(json, path, "test_rows", &r->testRows);
}

}  // namespace

int64_t syntheticTestRows(const SyntheticCriteoOptions& options) {
  return options.testRows > 0 ? options.testRows : std::max<int64_t>(options.rows / 10, 1);
}

std::string syntheticOracleJson(const PlantedCriteoModel& model, const SyntheticCriteoOracle& r) {
  const auto& o = model.options();
  std::vector<uint64_t> vocab;
  for (int t = 0; t < model.tables(); ++t) vocab.push_back(model.vocab(t));
  // (nlohmann writes each double with the digits that read back exactly, a
  // figure that is not finite as null)
  const nlohmann::ordered_json json = {
      {"auc", r.auc},
      {"logloss", r.logloss},
      {"train_rows", r.trainRows},
      {"test_rows", r.testRows},
      {"ctr_train", r.ctrTrain},
      {"ctr_test", r.ctrTest},
      {"mean_p_test", r.meanPTest},
      {"bias", r.bias},
      {"seed", o.seed},
      {"tables", o.tables},
      {"min_vocab", o.minVocab},
      {"max_vocab", o.maxVocab},
      {"zipf", o.zipf},
      {"factor_dim", o.factorDim},
      {"target_ctr", o.ctr},
      {"weight_scale", o.weightScale},
      {"factor_scale", o.factorScale},
      {"dense_scale", o.denseScale},
      {"rare_rank", o.rareRank},
      {"rare_shrink", o.rareShrink},
      {"block_rows", o.blockRows},
      {"pairs", model.pairs().size()},
      {"vocab", vocab}};
  return json.dump(2) + "\n";
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
  nlohmann::json json;
  if (Status s = readOracleJson(path, &json); !s) return s;
  SyntheticCriteoOracle r;
  if (Status s = oracleFrom(json, path, &r); !s) return s;
  return r;
}

bool syntheticCriteoMatches(const SyntheticCriteoOptions& o, const std::string& dir) {
  const std::string path = dir + "/" + kSyntheticOracleFile;
  nlohmann::json json;
  SyntheticCriteoOracle figures;  // readable too, or the data set is made again
  if (!readOracleJson(path, &json) || !oracleFrom(json, path, &figures)) return false;
  const bool same =
      oracleHolds(json, "train_rows", o.rows) && oracleHolds(json, "test_rows", syntheticTestRows(o)) &&
      oracleHolds(json, "seed", o.seed) && oracleHolds(json, "tables", o.tables) &&
      oracleHolds(json, "min_vocab", o.minVocab) && oracleHolds(json, "max_vocab", o.maxVocab) &&
      oracleHolds(json, "zipf", o.zipf) && oracleHolds(json, "factor_dim", o.factorDim) &&
      oracleHolds(json, "target_ctr", o.ctr) && oracleHolds(json, "weight_scale", o.weightScale) &&
      oracleHolds(json, "factor_scale", o.factorScale) && oracleHolds(json, "dense_scale", o.denseScale) &&
      oracleHolds(json, "rare_rank", o.rareRank) && oracleHolds(json, "rare_shrink", o.rareShrink) &&
      oracleHolds(json, "block_rows", o.blockRows);
  if (!same) return false;
  std::error_code ec;
  return std::filesystem::is_regular_file(dir + "/" + kSyntheticTrainFile, ec) &&
         std::filesystem::is_regular_file(dir + "/" + kSyntheticTestFile, ec);
}

std::string describeSyntheticCriteo(const SyntheticCriteoOptions& options) {
  return PlantedCriteoModel(options).summary();
}

}  // namespace troupe::data
