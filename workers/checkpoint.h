// A training job's checkpoints (DESIGN.md, Supervision and fault
// tolerance): a consistent cut of the job. The coordinator pauses every
// worker at a step boundary with every push acknowledged (sync modes: every
// rank at the same step), each shard copies its state in memory (sync
// modes: and the lowest live rank the group's model), the workers train on
// while the files are written (ps/shard_image.h, workers/model_image.h), and
// the manifest is written last, so a checkpoint directory without one is
// incomplete and never used:
//
//   <checkpoint.dir>/ckpt-000003/
//     shard-0.ckpt ... shard-{S-1}.ckpt   each checksummed (XXH3), fsynced, renamed
//     model.ckpt                          sync modes: the group's dense state
//                                         (allreduce: and its tables), step, place in the data
//     residuals-0.ckpt ...                compression with error feedback: what each
//                                         worker's codecs held back (workers/residual_image.h)
//     config.toml                         the job's config
//     manifest.toml                       what the job was, the cut, every file with
//                                         its size and checksum; a checksum of its own
//   <checkpoint.dir>/latest               the name of the newest complete one
//
// A checkpoint is resumed (troupe train --resume) only when it is whole and
// fits: every file present with its size and checksum, and the same model,
// tables, shards, workers and mode as the config asks for; otherwise it is
// refused with one line naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "workers/regroup.h"

namespace troupe::workers {

inline constexpr const char* kManifestFile = "manifest.toml";
inline constexpr const char* kLatestFile = "latest";

struct CheckpointFile {
  std::string file;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};

// What a job is, as far as resuming goes: a checkpoint fits a config when
// these agree.
struct JobShape {
  std::string mode, consistency, model, embeddingOptimizer, denseOptimizer;
  int64_t workers = 0, servers = 0, denseParameters = 0;
  std::vector<int64_t> tableDims;
  // A pipeline across the workers (pipeline.stages; 0: none): every
  // process reads every batch, so the data is divided in one part.
  int64_t pipelineStages = 0;
};

JobShape jobShapeOf(const Config& config);
// The first difference, named ("the checkpoint has 4 tables; the config 26").
Status checkShape(const JobShape& checkpoint, const JobShape& config);

struct CheckpointManifest {
  int64_t id = 0;
  std::string created;               // UTC, ISO 8601
  JobShape shape;
  std::vector<int64_t> workerSteps;  // the cut: where each worker resumes
  // Sync modes: the cut's epoch and the batches of it the steps took (the
  // resumed job's ranks divide the rest).
  int64_t cutEpoch = 0, cutBatch = 0;
  // Sync modes: how the group divided the data up to the cut (the job's
  // division, then each group formed again), for the resumed job's ledger.
  std::vector<DataDivision> divisions;
  std::vector<int64_t> samplesApplied;  // the ledger of each shard at the cut
  CheckpointFile config;             // config.toml
  std::vector<CheckpointFile> shards;   // by shard
  // Sync modes (allreduce, hybrid): the group's model (workers/model_image.h),
  // one file; none in ps mode.
  std::vector<CheckpointFile> models;
  // Compression with error feedback (workers/residual_image.h): by worker,
  // what its codecs held back at the cut; an entry's file is empty for a
  // worker that wrote none (one that trained no more).
  std::vector<CheckpointFile> residuals;
};

// The directory of checkpoint `id` under `base`.
std::string checkpointDir(const std::string& base, int64_t id);
// Writes dir/manifest.toml last (temporary name, fsync, rename) and points
// base/latest at it.
Status writeManifest(const std::string& dir, const CheckpointManifest& manifest);
// Reads dir/manifest.toml: its own checksum, then every field.
Expected<CheckpointManifest> readManifest(const std::string& dir);
// The same for a manifest's text; `path` names it in errors.
Expected<CheckpointManifest> parseManifest(const std::string& text, const std::string& path);
// Every file the manifest lists: present, of its size, with its checksum.
Status verifyCheckpoint(const std::string& dir, const CheckpointManifest& manifest);
// The checkpoint to resume from `path`: a checkpoint directory (it holds a
// manifest), or a run directory or checkpoint.dir (its `latest`).
Expected<std::string> findCheckpoint(const std::string& path);
// The highest checkpoint id under `base`, complete or not (0: none).
int64_t highestCheckpointId(const std::string& base);
// Removes all but the newest `keep` complete checkpoints under `base` (and
// any incomplete one older than the newest complete one).
void pruneCheckpoints(const std::string& base, int64_t keep);

}  // namespace troupe::workers
