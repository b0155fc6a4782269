// What every process of a training job builds from the config: the data
// sources, the model's options, the embedding tables' options. One place, so
// the single-process trainer, the workers and the shards of a multi-process
// job agree on every shape and hyperparameter. Errors are SetupErrors naming
// the key.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "kernels/codec.h"
#include "kernels/row_optimizer.h"
#include "ps/embedding_table.h"
#include "workers/batch_source.h"
#include "workers/eval_schedule.h"
#include "workers/pipeline_schedule.h"
#include "workers/worker_core.h"

namespace troupe::workers {

kernels::OptimizerKind optimizerKind(const std::string& name, const char* key);
int64_t positive(const Config& c, const char* key);

// What the data section names, opened as batch sources.
struct DataSources {
  std::shared_ptr<BatchSource> train, test;
  std::string description;
  bool synthetic = false;
  double oracleAuc = std::nan(""), oracleLogloss = std::nan("");
};

// Generates synthetic data first when the config asks for it (cached).
DataSources openData(const Config& c, int threads);

// data.on_bad_record (or the older data.skip_bad_lines) says skip (the
// schema admits only fail and skip).
bool skipsBadRecords(const Config& c);

WorkerCoreOptions modelOptions(const Config& c, int threads);

// The embedding tables of a DLRM (empty for other models).
// train.mode of a multi-process job.
enum class TrainMode { kPs, kAllReduce, kHybrid };
// Throws SetupError naming the value when it is none of ps, allreduce, hybrid.
TrainMode trainMode(const Config& c);
const char* trainModeName(TrainMode m);
// collectives.backend, checked: "ring", "nccl" or "auto"; "auto" is "ring"
// where compression.allreduce needs it, and "nccl" with such a codec is
// refused (SetupError naming the pair).
std::string collectivesBackend(const Config& c);

// The compression.* keys (DESIGN.md, Compression), checked: each path's
// codec (pull: none, fp16 or bf16; the count model: none anywhere, its
// values must stay exact), fraction and chunk in range, warmup_steps >= 0.
// Throws SetupError naming the key.
struct CompressionConfig {
  kernels::CodecOptions push, pull, allreduce;
  int64_t warmupSteps = 0;
  int64_t residualRows = 0;  // a worker's bound on push residual rows (0: none)
  bool any() const;
};
CompressionConfig compressionOf(const Config& c);
// pipeline.*: checked (stages >= 1, micro-batches >= 1, a known schedule, a
// cut of increasing layers); cut empty: balanced. Throws SetupError naming
// the key.
struct PipelineConfig {
  int stages = 1;
  int replicas = 1;  // data-parallel copies of the pipeline (in one process, or a process a stage)
  int microBatches = 4;
  bool any() const { return stages > 1 || replicas > 1; }
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  std::vector<int> cut;  // the first layer of stages 1 .. stages - 1, or empty
};
PipelineConfig pipelineOf(const Config& c);
// train.eval_every_steps / train.eval_every_seconds, checked (>= 0, and not
// for the count model nor a pipeline across processes, which evaluate only
// at the end). Throws SetupError naming the key.
EvalSchedule evalScheduleOf(const Config& c, ModelKind kind);
// The cut of an MLP of `widths` for `p` (cutMlpLayers' form: 0, the first
// layer of each later stage, the layer count), refused naming pipeline.cut
// when it does not fit the model.
std::vector<int> pipelineCut(const PipelineConfig& p, const std::vector<int64_t>& widths);
// ps.stale_lr and ps.delay_compensation, checked (a known value, lambda
// >= 0, not with ps.replicas = 2: a backup serves no pulls, so it could not
// apply a push as its primary does). Throws SetupError naming the key.
struct StaleAware {
  bool staleLr = false;
  float delayCompensation = 0;
  bool any() const { return staleLr || delayCompensation > 0; }
};
StaleAware staleAwareOf(const Config& c);
// Parameter-server processes the job runs: none in allreduce mode.
int64_t serverCount(const Config& c);
// ps.replicas, checked: 1, or 2 in ps and hybrid modes with at least two
// ps processes (the copies of a shard are never in the same process).
// Throws SetupError naming what is wrong.
int64_t psReplicas(const Config& c);

// How long a training pull may wait at a shard for a slower worker's step
// (BSP, SSP): long enough for the coordinator to find that worker hung
// (supervision.stall_timeout_s) and for its replacement to be ready
// (supervision.replace_timeout_s), twice over. A pull that waits longer
// fails, naming the worker it waited for.
std::chrono::seconds pullWaitBound(const Config& c);

// How long a sync mode's collective waits for its peers: collectives.timeout_s,
// and with supervision.on_worker_loss = restart or shrink at most half of
// supervision.stall_timeout_s (a rank waiting for a peer that is alive but
// stuck gives up, and waits for the group to form again, before the
// coordinator declares that peer hung).
std::chrono::seconds collectivesTimeout(const Config& c);

std::vector<ps::EmbeddingTableOptions> tableOptions(const Config& c, const WorkerCoreOptions& model);

// The count model (model.kind = count) in this job: the scale of its
// gradients, the ranks a step's pushes are averaged over (BSP shards, the
// workers' all-reduce: cluster.workers), or 1 (SSP, ASP, one process).
// Throws SetupError when its counts could not come out exact: a run cut
// short (train.max_steps), more than 2^24 rows x epochs (floats), a group
// that shrinks, or a training set
// (`rowsPerEpoch`) that the W workers' batches do not divide into whole
// steps (the last, short step would be averaged over fewer ranks).
double countScale(const Config& c, int64_t rowsPerEpoch);

}  // namespace troupe::workers
