#include "workers/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "common/check.h"
#include "common/checksum_file.h"
#include "common/logging.h"
#include "workers/job_setup.h"
#include "workers/worker_core.h"

namespace troupe::workers {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kFormat = 1;
constexpr const char* kChecksumKey = "manifest_checksum = \"";

std::string hex(uint64_t x) { return fmt::format("{:016x}", x); }

// Writes `text` to `path` whole: temporary name, fsync, rename, directory fsync.
Status writeWhole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status::ioError(fmt::format("cannot write {}", tmp));
  const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status::ioError(fmt::format("cannot write {}", path));
  }
  const int dir = ::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return Status::ok();
}

Expected<std::string> readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::notFound(fmt::format("{}: cannot open", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

JobShape jobShapeOf(const Config& c) {
  JobShape s;
  s.mode = trainModeName(trainMode(c));
  s.consistency = c.getString("ps.consistency");
  s.model = c.getString("model.kind");
  s.embeddingOptimizer = c.getString("train.embedding_optimizer");
  s.denseOptimizer = c.getString("train.dense_optimizer");
  s.workers = c.getInt("cluster.workers");
  s.servers = serverCount(c);
  if (const PipelineConfig p = pipelineOf(c); p.any() && s.workers > 0) s.pipelineStages = p.stages;
  WorkerCoreOptions model = modelOptions(c, 1);
  WorkerCore core(model);
  s.denseParameters = core.denseParameters();
  for (const auto& t : tableOptions(c, model)) s.tableDims.push_back(t.dim);
  return s;
}

Status checkShape(const JobShape& a, const JobShape& b) {
  auto differs = [](const char* what, const auto& x, const auto& y) {
    return Status::invalidArgument(fmt::format("the checkpoint's {} is {}; the config's {}", what, x, y));
  };
  if (a.model != b.model) return differs("model.kind", a.model, b.model);
  if (a.mode != b.mode) return differs("train.mode", a.mode, b.mode);
  if (a.consistency != b.consistency) return differs("ps.consistency", a.consistency, b.consistency);
  if (a.workers != b.workers) return differs("cluster.workers", a.workers, b.workers);
  if (a.pipelineStages != b.pipelineStages) {
    return differs("pipeline across the workers (its stages; 0: none)", a.pipelineStages, b.pipelineStages);
  }
  if (a.servers != b.servers) return differs("number of parameter servers", a.servers, b.servers);
  if (a.tableDims.size() != b.tableDims.size()) {
    return differs("number of embedding tables", a.tableDims.size(), b.tableDims.size());
  }
  for (size_t t = 0; t < a.tableDims.size(); ++t) {
    if (a.tableDims[t] != b.tableDims[t]) {
      return differs(fmt::format("table {} dim", t).c_str(), a.tableDims[t], b.tableDims[t]);
    }
  }
  if (a.denseParameters != b.denseParameters) {
    return differs("dense parameter count", a.denseParameters, b.denseParameters);
  }
  if (a.embeddingOptimizer != b.embeddingOptimizer) {
    return differs("train.embedding_optimizer", a.embeddingOptimizer, b.embeddingOptimizer);
  }
  if (a.denseOptimizer != b.denseOptimizer) return differs("train.dense_optimizer", a.denseOptimizer, b.denseOptimizer);
  return Status::ok();
}

std::string checkpointDir(const std::string& base, int64_t id) {
  return (fs::path(base) / fmt::format("ckpt-{:06d}", id)).string();
}

Status writeManifest(const std::string& dir, const CheckpointManifest& m) {
  std::string t = "# troupe checkpoint manifest, written last: a checkpoint without one is incomplete\n";
  t += fmt::format("format = {}\nid = {}\ncreated = {}\n", kFormat, m.id, quoted(m.created));
  const JobShape& s = m.shape;
  t += fmt::format("model = {}\nmode = {}\nconsistency = {}\nworkers = {}\nservers = {}\n", quoted(s.model),
                   quoted(s.mode), quoted(s.consistency), s.workers, s.servers);
  if (s.pipelineStages > 0) t += fmt::format("pipeline_stages = {}\n", s.pipelineStages);
  t += fmt::format("table_dims = [{}]\ndense_parameters = {}\nembedding_optimizer = {}\ndense_optimizer = {}\n",
                   fmt::join(s.tableDims, ", "), s.denseParameters, quoted(s.embeddingOptimizer),
                   quoted(s.denseOptimizer));
  t += fmt::format("worker_steps = [{}]\nsamples_applied = [{}]\n", fmt::join(m.workerSteps, ", "),
                   fmt::join(m.samplesApplied, ", "));
  t += fmt::format("cut_epoch = {}\ncut_batch = {}\n", m.cutEpoch, m.cutBatch);
  std::vector<std::string> divisions;
  for (const auto& d : m.divisions) divisions.push_back(fmt::format("[{}, {}, {}]", d.epoch, d.fromBatch, d.parts));
  t += fmt::format("divisions = [{}]\n", fmt::join(divisions, ", "));
  auto file = [&](const char* table, const CheckpointFile& f, int64_t rank) {
    t += fmt::format("\n[[{}]]\n", table);
    if (rank >= 0) t += fmt::format("rank = {}\n", rank);
    t += fmt::format("file = {}\nbytes = {}\nchecksum = {}\n", quoted(f.file), f.bytes, quoted(hex(f.checksum)));
  };
  file("config", m.config, -1);
  for (size_t r = 0; r < m.shards.size(); ++r) file("shard", m.shards[r], int64_t(r));
  for (const auto& f : m.models) file("model_file", f, -1);
  for (size_t r = 0; r < m.residuals.size(); ++r) {
    if (!m.residuals[r].file.empty()) file("residuals", m.residuals[r], int64_t(r));
  }
  t += fmt::format("\n{}{}\"\n", kChecksumKey, hex(xxh3(t.data(), t.size())));
  Status s2 = writeWhole((fs::path(dir) / kManifestFile).string(), t);
  if (!s2.isOk()) return s2;
  return writeWhole((fs::path(dir).parent_path() / kLatestFile).string(), fs::path(dir).filename().string() + "\n");
}

Expected<CheckpointManifest> readManifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifestFile).string();
  auto text = readText(path);
  if (!text.hasValue()) {
    return Status::notFound(fmt::format("{}: no manifest: the checkpoint is incomplete or this is not one", path));
  }
  return parseManifest(*text, path);
}

Expected<CheckpointManifest> parseManifest(const std::string& manifestText, const std::string& path) {
  const std::string* text = &manifestText;
  const size_t at = text->rfind(kChecksumKey);
  if (at == std::string::npos || at == 0 || text->size() < at + std::strlen(kChecksumKey) + 16) {
    return Status::corruption(fmt::format("{}: truncated (no manifest_checksum)", path));
  }
  const std::string stored = text->substr(at + std::strlen(kChecksumKey), 16);
  const std::string computed = hex(xxh3(text->data(), at - 1));
  if (stored != computed) {
    return Status::corruption(
        fmt::format("{}: checksum mismatch (stored {}, computed {}): the manifest is corrupt", path, stored, computed));
  }
  CheckpointManifest m;
  try {
    toml::table tbl = toml::parse(*text, path);
    auto str = [&](const char* key) {
      auto v = tbl[key].value<std::string>();
      if (!v) TROUPE_SETUP_ERROR("{}: '{}' is missing or not text", path, key);
      return *v;
    };
    auto num = [&](const char* key) {
      auto v = tbl[key].value<int64_t>();
      if (!v) TROUPE_SETUP_ERROR("{}: '{}' is missing or not an integer", path, key);
      return *v;
    };
    auto list = [&](const char* key) {
      std::vector<int64_t> out;
      const toml::array* a = tbl[key].as_array();
      if (!a) TROUPE_SETUP_ERROR("{}: '{}' is missing or not a list", path, key);
      for (const auto& e : *a) {
        auto v = e.value<int64_t>();
        if (!v) TROUPE_SETUP_ERROR("{}: '{}' holds something other than integers", path, key);
        out.push_back(*v);
      }
      return out;
    };
    auto fileOf = [&](const toml::table& f) {
      CheckpointFile out;
      auto file = f["file"].value<std::string>();
      auto bytes = f["bytes"].value<int64_t>();
      auto sum = f["checksum"].value<std::string>();
      if (!file || !bytes || !sum || file->empty() || *file == "." || *file == ".." ||
          file->find('/') != std::string::npos || *bytes < 0 || sum->size() != 16 ||
          sum->find_first_not_of("0123456789abcdef") != std::string::npos) {
        TROUPE_SETUP_ERROR("{}: a file entry is incomplete or malformed", path);
      }
      out.file = *file;
      out.bytes = uint64_t(*bytes);
      out.checksum = std::stoull(*sum, nullptr, 16);
      return out;
    };
    if (num("format") != kFormat) {
      TROUPE_SETUP_ERROR("{}: format {}, this troupe reads {}", path, num("format"), kFormat);
    }
    m.id = num("id");
    m.created = str("created");
    m.shape.model = str("model");
    m.shape.mode = str("mode");
    m.shape.consistency = str("consistency");
    m.shape.workers = num("workers");
    m.shape.servers = num("servers");
    m.shape.pipelineStages = tbl["pipeline_stages"].value<int64_t>().value_or(0);
    if (m.shape.pipelineStages < 0 || m.shape.pipelineStages > m.shape.workers ||
        (m.shape.pipelineStages > 0 && m.shape.workers % m.shape.pipelineStages != 0)) {
      TROUPE_SETUP_ERROR("{}: pipeline_stages = {} for {} workers", path, m.shape.pipelineStages, m.shape.workers);
    }
    m.shape.tableDims = list("table_dims");
    m.shape.denseParameters = num("dense_parameters");
    m.shape.embeddingOptimizer = str("embedding_optimizer");
    m.shape.denseOptimizer = str("dense_optimizer");
    m.workerSteps = list("worker_steps");
    m.samplesApplied = list("samples_applied");
    m.cutEpoch = tbl["cut_epoch"].value<int64_t>().value_or(0);
    m.cutBatch = tbl["cut_batch"].value<int64_t>().value_or(0);
    if (m.cutEpoch < 0 || m.cutBatch < 0) {
      TROUPE_SETUP_ERROR("{}: the cut is at batch {} of epoch {}", path, m.cutBatch, m.cutEpoch);
    }
    if (tbl.contains("divisions")) {
      const toml::array* divisions = tbl["divisions"].as_array();
      if (!divisions) TROUPE_SETUP_ERROR("{}: 'divisions' is not a list", path);
      for (const auto& e : *divisions) {
        const toml::array* d = e.as_array();
        auto at = [&](size_t i) { return d && d->size() == 3 ? (*d)[i].value<int64_t>() : std::nullopt; };
        if (!at(0) || !at(1) || !at(2)) {
          TROUPE_SETUP_ERROR("{}: 'divisions' holds something other than [epoch, first batch, ranks]", path);
        }
        const DataDivision next{*at(0), *at(1), *at(2)};
        // The job's own first ({0, 0, workers}), then each in order, of no
        // more ranks than the job has, none past the cut.
        const bool first = m.divisions.empty();
        const int64_t parts = m.shape.pipelineStages > 0 ? 1 : m.shape.workers;  // (a pipeline's: one)
        const DataDivision before = first ? DataDivision{0, 0, 0} : m.divisions.back();
        const bool ordered = next.epoch > before.epoch || (next.epoch == before.epoch && next.fromBatch >= before.fromBatch);
        const bool pastCut = next.epoch > m.cutEpoch || (next.epoch == m.cutEpoch && next.fromBatch > m.cutBatch);
        if ((first && (next.epoch != 0 || next.fromBatch != 0 || next.parts != parts)) || !ordered ||
            next.parts < 1 || next.parts > parts || pastCut) {
          TROUPE_SETUP_ERROR("{}: 'divisions' entry [{}, {}, {}] does not follow from the job ({} workers{}: the data "
                             "in at most {} parts) and the cut (batch {} of epoch {})",
                             path, next.epoch, next.fromBatch, next.parts, m.shape.workers,
                             m.shape.pipelineStages > 0 ? ", a pipeline" : "", parts, m.cutBatch, m.cutEpoch);
        }
        m.divisions.push_back(next);
      }
    }
    const toml::array* configs = tbl["config"].as_array();
    if (!configs || configs->size() != 1 || !configs->front().as_table()) {
      TROUPE_SETUP_ERROR("{}: no [[config]] entry", path);
    }
    m.config = fileOf(*configs->front().as_table());
    const toml::array* shards = tbl["shard"].as_array();
    if (shards) {
      for (const auto& e : *shards) {
        if (!e.as_table()) TROUPE_SETUP_ERROR("{}: a [[shard]] entry is not a table", path);
        m.shards.push_back(fileOf(*e.as_table()));
      }
    }
    if (const toml::array* models = tbl["model_file"].as_array()) {
      for (const auto& e : *models) {
        if (!e.as_table()) TROUPE_SETUP_ERROR("{}: a [[model_file]] entry is not a table", path);
        m.models.push_back(fileOf(*e.as_table()));
      }
    }
    const size_t models = m.shape.mode == "ps" ? 0 : 1;
    if (m.models.size() != models) {
      TROUPE_SETUP_ERROR("{}: {} model files for a job in {} mode (it takes {})", path, m.models.size(), m.shape.mode,
                         models);
    }
    if (int64_t(m.shards.size()) != m.shape.servers || int64_t(m.workerSteps.size()) != m.shape.workers ||
        m.samplesApplied.size() != m.shards.size()) {
      TROUPE_SETUP_ERROR("{}: {} shard files and {} worker steps for {} servers and {} workers", path, m.shards.size(),
                         m.workerSteps.size(), m.shape.servers, m.shape.workers);
    }
    if (const toml::array* residuals = tbl["residuals"].as_array()) {
      m.residuals.assign(size_t(m.workerSteps.size()), CheckpointFile{});
      for (const auto& e : *residuals) {
        const toml::table* f = e.as_table();
        auto rank = f ? (*f)["rank"].value<int64_t>() : std::nullopt;
        if (!rank || *rank < 0 || *rank >= m.shape.workers || !m.residuals[size_t(*rank)].file.empty()) {
          TROUPE_SETUP_ERROR("{}: a [[residuals]] entry has no rank of the job's {} workers, or one named twice", path,
                             m.shape.workers);
        }
        m.residuals[size_t(*rank)] = fileOf(*f);
      }
    }
  } catch (const toml::parse_error& e) {
    return Status::corruption(fmt::format("{}: {}", path, e.description()));
  } catch (const SetupError& e) {
    return Status::corruption(e.what());
  } catch (const std::exception& e) {
    return Status::corruption(fmt::format("{}: {}", path, e.what()));
  }
  return m;
}

Status verifyCheckpoint(const std::string& dir, const CheckpointManifest& m) {
  std::vector<CheckpointFile> files = m.shards;
  files.insert(files.end(), m.models.begin(), m.models.end());
  for (const auto& f : m.residuals) {
    if (!f.file.empty()) files.push_back(f);
  }
  files.push_back(m.config);
  for (const auto& f : files) {
    const std::string path = (fs::path(dir) / f.file).string();
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) return Status::notFound(fmt::format("{}: missing ({})", path, ec.message()));
    if (size != f.bytes) {
      return Status::corruption(fmt::format("{}: {} bytes, the manifest says {}: truncated or replaced", path, size, f.bytes));
    }
    auto text = readText(path);
    if (!text.hasValue()) return text.status();
    // The shard files carry the XXH3 of their bytes before it in their last
    // 8 bytes; config.toml's is of the whole file.
    const bool trailer = f.file != m.config.file;
    uint64_t sum = 0;
    if (trailer) {
      if (text->size() < 8) return Status::corruption(fmt::format("{}: truncated", path));
      std::memcpy(&sum, text->data() + text->size() - 8, 8);
      if (sum != xxh3(text->data(), text->size() - 8)) {
        return Status::corruption(fmt::format("{}: checksum mismatch: the file is corrupt", path));
      }
    } else {
      sum = xxh3(text->data(), text->size());
    }
    if (sum != f.checksum) {
      return Status::corruption(fmt::format("{}: checksum {} but the manifest says {}: not the file it lists", path,
                                            hex(sum), hex(f.checksum)));
    }
  }
  return Status::ok();
}

Expected<std::string> findCheckpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return Status::notFound(fmt::format("{}: no such directory", path));
  if (fs::exists(fs::path(path) / kManifestFile, ec)) return path;
  // A checkpoint directory without its manifest: readManifest says it is incomplete.
  for (const auto& e : fs::directory_iterator(path, ec)) {
    if (e.path().extension() == ".ckpt") return path;
  }
  for (const fs::path base : {fs::path(path), fs::path(path) / "checkpoints"}) {
    auto latest = readText((base / kLatestFile).string());
    if (!latest.hasValue()) continue;
    std::string name = *latest;
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
    if (name.empty() || name.find('/') != std::string::npos) {
      return Status::corruption(fmt::format("{}: does not name a checkpoint", (base / kLatestFile).string()));
    }
    return (base / name).string();
  }
  return Status::notFound(
      fmt::format("{}: holds no checkpoint (no {} here or in checkpoints/, no {})", path, kLatestFile, kManifestFile));
}

namespace {

// The checkpoint directories under `base`, by id.
std::vector<std::pair<int64_t, fs::path>> checkpointsUnder(const std::string& base) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("ckpt-", 0) != 0 || name.size() <= 5) continue;
    if (name.find_first_not_of("0123456789", 5) != std::string::npos || name.size() > 5 + 18) continue;
    out.emplace_back(std::stoll(name.substr(5)), e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int64_t highestCheckpointId(const std::string& base) {
  const auto all = checkpointsUnder(base);
  return all.empty() ? 0 : all.back().first;
}

void pruneCheckpoints(const std::string& base, int64_t keep) {
  std::error_code ec;
  const auto all = checkpointsUnder(base);
  std::vector<std::pair<int64_t, fs::path>> complete;
  for (const auto& c : all) {
    if (fs::exists(c.second / kManifestFile)) complete.push_back(c);
  }
  if (complete.empty()) return;
  const int64_t newest = complete.back().first;
  const size_t kept = size_t(std::max<int64_t>(keep, 1));
  for (size_t i = 0; i + kept < complete.size(); ++i) fs::remove_all(complete[i].second, ec);
  for (const auto& c : all) {
    if (c.first < newest && !fs::exists(c.second / kManifestFile)) fs::remove_all(c.second, ec);  // an abandoned one
  }
}

}  // namespace troupe::workers
