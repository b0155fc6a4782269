#include "apps/inspect_command.h"

#include <cstdio>
#include <memory>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/cli_common.h"
#include "common/check.h"
#include "ps/shard_image.h"
#include "workers/checkpoint.h"
#include "workers/model_image.h"
#include "workers/residual_image.h"

namespace troupe::apps {
namespace {

int runInspect(const std::string& path) {
  auto dir = workers::findCheckpoint(path);
  if (!dir.hasValue()) TROUPE_SETUP_ERROR("inspect: {}", dir.status().message());
  auto m = workers::readManifest(*dir);
  if (!m.hasValue()) TROUPE_SETUP_ERROR("inspect: {}", m.status().message());
  Status whole = workers::verifyCheckpoint(*dir, *m);
  if (!whole.isOk()) TROUPE_SETUP_ERROR("inspect: {}", whole.message());
  const workers::JobShape& s = m->shape;
  std::printf("checkpoint %lld  %s  written %s\n", static_cast<long long>(m->id), dir->c_str(), m->created.c_str());
  std::printf("job        %s model, train.mode %s, %s, %lld workers, %lld parameter servers\n", s.model.c_str(),
              s.mode.c_str(), s.consistency.c_str(), static_cast<long long>(s.workers),
              static_cast<long long>(s.servers));
  std::printf("model      %zu embedding tables (dims %s, %s), %lld dense parameters (%s)\n", s.tableDims.size(),
              fmt::format("{}", fmt::join(s.tableDims, " ")).c_str(), s.embeddingOptimizer.c_str(),
              static_cast<long long>(s.denseParameters), s.denseOptimizer.c_str());
  std::printf("cut        worker steps %s (each worker resumes there)\n",
              fmt::format("{}", fmt::join(m->workerSteps, " ")).c_str());
  uint64_t total = m->config.bytes;
  for (size_t r = 0; r < m->shards.size(); ++r) {
    const auto& f = m->shards[r];
    auto img = ps::readShardImage(*dir + "/" + f.file);
    if (!img.hasValue()) TROUPE_SETUP_ERROR("inspect: {}", img.status().message());
    int64_t rows = 0;
    std::string perTable;
    for (const auto& t : img->tables) {
      rows += int64_t(t.keys.size());
      perTable += fmt::format("{}{}", perTable.empty() ? "" : " ", t.keys.size());
    }
    std::printf("shard %zu    %s  %.2f MB  xxh3 %016llx  %lld rows (per table: %s), %lld dense weights, "
                "%lld samples applied, %lld pushes applied\n",
                r, f.file.c_str(), double(f.bytes) / 1e6, static_cast<unsigned long long>(f.checksum),
                static_cast<long long>(rows), perTable.c_str(), static_cast<long long>(img->denseSize),
                static_cast<long long>(img->samplesApplied), static_cast<long long>(img->pushesApplied));
    total += f.bytes;
  }
  for (const auto& f : m->models) {
    auto img = workers::readModelImage(*dir + "/" + f.file);
    if (!img.hasValue()) TROUPE_SETUP_ERROR("inspect: {}", img.status().message());
    int64_t rows = 0;
    std::string perTable;
    for (size_t i = 0; i < img->tableCount(); ++i) {
      const auto& t = (*img->tables)[i];
      rows += int64_t(t.keys.size());
      perTable += fmt::format("{}{}", perTable.empty() ? "" : " ", t.keys.size());
    }
    std::printf("model      %s  %.2f MB  xxh3 %016llx  step %lld (epoch %lld, from its batch %lld; both from 0), %lld dense "
                "weights with optimizer state, %s, %lld samples applied\n",
                f.file.c_str(), double(f.bytes) / 1e6, static_cast<unsigned long long>(f.checksum),
                static_cast<long long>(img->step), static_cast<long long>(img->epoch),
                static_cast<long long>(img->epochBatch), static_cast<long long>(img->denseParameters),
                img->tableCount() == 0 ? "no tables (they are on the shards, or the model has none)"
                                    : fmt::format("a replica of the tables: {} rows (per table: {})", rows, perTable).c_str(),
                static_cast<long long>(img->samplesApplied));
    total += f.bytes;
  }
  size_t residualFiles = 0;
  for (size_t r = 0; r < m->residuals.size(); ++r) {
    const auto& f = m->residuals[r];
    if (f.file.empty()) continue;
    auto img = workers::readResidualImage(*dir + "/" + f.file);
    if (!img.hasValue()) TROUPE_SETUP_ERROR("inspect: {}", img.status().message());
    if (img->worker != int64_t(r)) {
      TROUPE_SETUP_ERROR("inspect: {}/{}: holds worker {}'s residuals; the manifest lists it for worker {}", *dir,
                         f.file, img->worker, r);
    }
    int64_t rows = 0, dense = 0, reduced = 0;
    for (const auto& t : img->pushRows) rows += int64_t(t.keys.size());
    for (const auto& d : img->pushDense) dense += int64_t(d.size());
    for (const auto& t : img->allreduce) reduced += int64_t(t.residual.size() + t.owned.size());
    std::printf("residuals  %s  %.2f MB  xxh3 %016llx  worker %zu at step %lld: push residuals of %lld rows and %lld "
                "dense values, all-reduce residuals of %lld values in %zu tensors\n",
                f.file.c_str(), double(f.bytes) / 1e6, static_cast<unsigned long long>(f.checksum), r,
                static_cast<long long>(img->step), static_cast<long long>(rows), static_cast<long long>(dense),
                static_cast<long long>(reduced), img->allreduce.size());
    total += f.bytes;
    ++residualFiles;
  }
  std::printf("files      %zu, %.2f MB, every size and checksum verified\n",
              m->shards.size() + m->models.size() + residualFiles + 2, double(total) / 1e6);
  return kExitOk;
}

}  // namespace

void addInspectCommand(CLI::App* app, int* result) {
  auto path = std::make_shared<std::string>();
  auto* cmd = app->add_subcommand("inspect", "Verify a checkpoint and print what it holds");
  cmd->add_option("checkpoint", *path, "a checkpoint directory, or a run directory (its latest checkpoint)")
      ->required();
  cmd->callback([=] { *result = runGuarded([&] { return runInspect(*path); }); });
}

}  // namespace troupe::apps
