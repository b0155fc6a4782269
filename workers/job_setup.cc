#include "workers/job_setup.h"

#include <cmath>
#include <cstdlib>

#include "collectives/compressed_allreduce.h"
#include "data/synthetic_cache.h"
#include "common/check.h"
#include "data/criteo_reader.h"

namespace troupe::workers {

kernels::OptimizerKind optimizerKind(const std::string& name, const char* key) {
  if (name == "sgd") return kernels::OptimizerKind::kSgd;
  if (name == "adagrad") return kernels::OptimizerKind::kAdagrad;
  if (name == "adam") return kernels::OptimizerKind::kAdam;
  if (name == "ftrl") return kernels::OptimizerKind::kFtrl;
  TROUPE_SETUP_ERROR("config: {} = '{}' is not an optimizer (sgd, adagrad, adam, ftrl)", key, name);
}

int64_t positive(const Config& c, const char* key) {
  const int64_t v = c.getInt(key);
  if (v < 1) TROUPE_SETUP_ERROR("config: {} must be >= 1, got {}", key, v);
  return v;
}

bool skipsBadRecords(const Config& c) {
  // (The schema takes only fail and skip.)
  return c.getString("data.on_bad_record") == "skip" || c.getBool("data.skip_bad_lines");
}

DataSources openData(const Config& c, int threads) {
  DataSources d;
  const std::string kind = c.getString("data.kind");
  const std::string model = c.getString("model.kind");
  const int64_t batch = positive(c, "train.batch_size");
  auto check = [](auto&& opened) {
    if (!opened.hasValue()) TROUPE_SETUP_ERROR("{}", opened.status().message());
    return std::shared_ptr<BatchSource>(std::move(*opened));
  };
  if (kind == "criteo-synthetic" || kind == "criteo") {
    if (model != "dlrm" && model != "count") {
      TROUPE_SETUP_ERROR("config: data.kind '{}' needs model.kind 'dlrm' (or 'count'), got '{}'", kind, model);
    }
    std::string trainPath = c.getString("data.train"), testPath = c.getString("data.test");
    int categorical = int(c.getInt("data.categorical"));
    if (kind == "criteo-synthetic") {
      auto set = data::ensureSyntheticData(c, "", false, threads);
      if (!set.hasValue()) TROUPE_SETUP_ERROR("synthetic data: {}", set.status().toString());
      trainPath = set->trainPath;
      testPath = set->testPath;
      categorical = int(c.getInt("data.synthetic.tables"));
      d.synthetic = true;
      d.oracleAuc = set->oracle.auc;
      d.oracleLogloss = set->oracle.logloss;
    } else if (trainPath.empty() || testPath.empty()) {
      TROUPE_SETUP_ERROR("config: data.kind 'criteo' needs data.train and data.test");
    }
    CriteoSourceOptions o;
    o.batchSize = batch;
    o.numCategorical = categorical;
    o.skipBadLines = skipsBadRecords(c);
    // With one epoch nothing replays the cache: keep no batches.
    o.inMemory = c.getBool("data.in_memory") && c.getInt("train.epochs") > 1;
    o.path = trainPath;
    o.maxRows = c.getInt("data.max_train_rows");
    d.train = check(openCriteoSource(o));
    // The count model checks its values against the training set itself.
    if (model == "count") testPath = trainPath;
    o.path = testPath;
    o.inMemory = true;
    if (model != "count") o.maxRows = -1;
    d.test = check(openCriteoSource(o));
    d.description = fmt::format("{} ({}, {})", kind, trainPath, testPath);
  } else if (kind == "fashion-mnist") {
    if (model != "mlp") TROUPE_SETUP_ERROR("config: data.kind 'fashion-mnist' needs model.kind 'mlp', got '{}'", model);
    std::string dir = c.getString("data.train");
    if (dir.empty()) dir = "/usr/share/datasets/fashion-mnist";
    MnistSourceOptions o;
    o.batchSize = batch;
    o.seed = uint64_t(c.getInt("run.seed"));
    o.imagesPath = dir + "/train-images-idx3-ubyte.gz";
    o.labelsPath = dir + "/train-labels-idx1-ubyte.gz";
    o.maxRows = c.getInt("data.max_train_rows");
    d.train = check(openMnistSource(o));
    o.shuffle = false;
    o.maxRows = -1;
    o.imagesPath = dir + "/t10k-images-idx3-ubyte.gz";
    o.labelsPath = dir + "/t10k-labels-idx1-ubyte.gz";
    d.test = check(openMnistSource(o));
    d.description = fmt::format("fashion-mnist ({})", dir);
  } else {
    TROUPE_SETUP_ERROR("config: data.kind '{}' cannot be trained on (criteo-synthetic, criteo, fashion-mnist)", kind);
  }
  return d;
}

WorkerCoreOptions modelOptions(const Config& c, int threads) {
  WorkerCoreOptions o;
  const std::string kind = c.getString("model.kind");
  o.seed = uint64_t(c.getInt("run.seed"));
  o.threads = threads;
  o.denseOptimizer.kind = optimizerKind(c.getString("train.dense_optimizer"), "train.dense_optimizer");
  o.denseOptimizer.learningRate = float(c.getFloat("train.dense_lr"));
  o.denseOptimizer.weightDecay = float(c.getFloat("train.weight_decay"));
  o.denseOptimizer.initialAccumulator = float(c.getFloat("train.adagrad_initial_accumulator"));
  if (kind == "dlrm" || kind == "count") {
    o.kind = kind == "dlrm" ? ModelKind::kDlrm : ModelKind::kCount;
    o.dlrm.embeddingDim = positive(c, "model.embedding_dim");
    o.dlrm.bottom = c.getIntList("model.bottom_mlp");
    o.dlrm.top = c.getIntList("model.top_mlp");
    o.dlrm.concatEmbeddings = c.getBool("model.concat_embeddings");
    o.dlrm.numTables = int(c.getString("data.kind") == "criteo-synthetic" ? c.getInt("data.synthetic.tables")
                                                                           : c.getInt("data.categorical"));
    o.dlrm.numDense = data::kCriteoIntFeatures;
    if (o.kind == ModelKind::kCount) {
      // Every update adds a count: plain SGD at rate 1, nothing else.
      o.denseOptimizer = kernels::OptimizerConfig{};
      o.denseOptimizer.kind = kernels::OptimizerKind::kSgd;
      o.denseOptimizer.learningRate = 1;
    }
  } else if (kind == "mlp") {
    o.kind = ModelKind::kMlp;
    o.mlpWidths = {784};
    for (int64_t w : c.getIntList("model.hidden")) o.mlpWidths.push_back(w);
    o.mlpWidths.push_back(positive(c, "model.classes"));
  } else {
    TROUPE_SETUP_ERROR("config: model.kind '{}' is not a model (dlrm, mlp, count)", kind);
  }
  return o;
}

std::vector<ps::EmbeddingTableOptions> tableOptions(const Config& c, const WorkerCoreOptions& model) {
  std::vector<ps::EmbeddingTableOptions> tables;
  if (model.kind == ModelKind::kMlp) return tables;
  const kernels::OptimizerKind kind = optimizerKind(c.getString("train.embedding_optimizer"), "train.embedding_optimizer");
  const bool count = model.kind == ModelKind::kCount;
  for (int t = 0; t < model.dlrm.numTables; ++t) {
    ps::EmbeddingTableOptions table;
    table.tableId = t;
    table.dim = model.dlrm.embeddingDim;
    table.seed = model.seed;
    table.initScale = float(c.getFloat("model.embedding_init_scale"));
    table.optimizer.kind = kind;
    table.optimizer.learningRate = float(c.getFloat("train.embedding_lr"));
    table.optimizer.initialAccumulator = float(c.getFloat("train.adagrad_initial_accumulator"));
    if (count) {
      // Rows start at (all but) zero, so a row holds its count exactly
      // (initScale 0 would mean the default scale); plain SGD at rate 1.
      table.initScale = 1e-30f;
      table.optimizer = kernels::OptimizerConfig{};
      table.optimizer.kind = kernels::OptimizerKind::kSgd;
      table.optimizer.learningRate = 1;
    }
    tables.push_back(table);
  }
  return tables;
}

double countScale(const Config& c, int64_t rowsPerEpoch) {
  if (c.getInt("train.max_steps") > 0) {
    TROUPE_SETUP_ERROR("config: model.kind = count checks every value against whole passes over the data, and "
                       "train.max_steps = {} cuts a pass short; leave it 0",
                       c.getInt("train.max_steps"));
  }
  // Every value is a float: exact up to 2^24, and the dense parameters
  // reach rows x epochs.
  const int64_t epochs = positive(c, "train.epochs");
  if (rowsPerEpoch * epochs >= (int64_t{1} << 24)) {
    TROUPE_SETUP_ERROR("config: model.kind = count holds its counts in floats, exact up to 2^24 = 16777216; {} rows "
                       "x {} epochs is more (set data.max_train_rows)",
                       rowsPerEpoch, epochs);
  }
  const int64_t workers = c.getInt("cluster.workers");
  if (workers <= 0) return 1;
  const TrainMode mode = trainMode(c);
  const bool averaged = mode != TrainMode::kPs || c.getString("ps.consistency") == "bsp";
  if (!averaged) return 1;
  if (mode != TrainMode::kPs && c.getString("supervision.on_worker_loss") == "shrink") {
    TROUPE_SETUP_ERROR("config: model.kind = count in train.mode = {} averages every step over all {} workers; a "
                       "group that shrinks (supervision.on_worker_loss = shrink) would count wrong",
                       trainModeName(mode), workers);
  }
  const int64_t round = workers * positive(c, "train.batch_size");
  if (rowsPerEpoch % round != 0) {
    TROUPE_SETUP_ERROR("config: model.kind = count averages each step over the {} workers, so the training rows ({}) "
                       "must be a whole number of steps of cluster.workers x train.batch_size = {} rows (set "
                       "data.max_train_rows = {}, say)",
                       workers, rowsPerEpoch, round, rowsPerEpoch / round * round);
  }
  return double(workers);
}

TrainMode trainMode(const Config& c) {
  const std::string m = c.getString("train.mode");
  if (m == "ps") return TrainMode::kPs;
  if (m == "allreduce") return TrainMode::kAllReduce;
  if (m == "hybrid") return TrainMode::kHybrid;
  TROUPE_SETUP_ERROR("config: train.mode must be ps, allreduce or hybrid, not '{}'", m);
}

const char* trainModeName(TrainMode m) {
  switch (m) {
    case TrainMode::kPs: return "ps";
    case TrainMode::kAllReduce: return "allreduce";
    case TrainMode::kHybrid: return "hybrid";
  }
  return "?";
}

std::string collectivesBackend(const Config& c) {
  const std::string b = c.getString("collectives.backend");
  if (b != "ring" && b != "nccl" && b != "auto") {
    TROUPE_SETUP_ERROR("config: collectives.backend must be ring, nccl or auto, not '{}'", b);
  }
  const kernels::CodecKind codec = compressionOf(c).allreduce.kind;
  if (b == "ring" || trainMode(c) == TrainMode::kPs) return b;
  const bool ncclCan = collectives::CompressedAllReduce::supports("nccl", codec).isOk();
  if (b == "auto") return ncclCan ? b : "ring";
  if (!ncclCan) TROUPE_SETUP_ERROR("config: {}", collectives::CompressedAllReduce::supports("nccl", codec).message());
  return b;
}

bool CompressionConfig::any() const {
  return push.kind != kernels::CodecKind::kNone || pull.kind != kernels::CodecKind::kNone ||
         allreduce.kind != kernels::CodecKind::kNone;
}

StaleAware staleAwareOf(const Config& c) {
  StaleAware out;
  const std::string lr = c.getString("ps.stale_lr");
  if (lr != "none" && lr != "inverse") TROUPE_SETUP_ERROR("config: ps.stale_lr must be none or inverse, got '{}'", lr);
  out.staleLr = lr == "inverse";
  out.delayCompensation = float(c.getFloat("ps.delay_compensation"));  // in [0, 1e6]: the schema's range
  if (out.staleLr && (c.getString("train.embedding_optimizer") == "ftrl" || c.getString("train.dense_optimizer") == "ftrl")) {
    TROUPE_SETUP_ERROR("config: ps.stale_lr = inverse with FTRL: FTRL computes each weight from its whole history, "
                       "so a smaller rate for one push rescales the weight, not the push (use ps.delay_compensation, "
                       "or another optimizer)");
  }
  if (out.any() && c.getInt("ps.replicas") == 2) {
    TROUPE_SETUP_ERROR("config: {} with ps.replicas = 2: a backup serves no pulls, so it cannot apply a push as "
                       "its primary does (staleness-aware updates need ps.replicas = 1)",
                       out.staleLr ? "ps.stale_lr = inverse" : "ps.delay_compensation");
  }
  return out;
}

EvalSchedule evalScheduleOf(const Config& c, ModelKind kind) {
  EvalSchedule out;
  out.everySteps = c.getInt("train.eval_every_steps");        // >= 0 and
  out.everySeconds = c.getFloat("train.eval_every_seconds");  // in [0, 1e9]: the schema's ranges
  if (!out.any()) return out;
  const std::string key = out.everySteps > 0 ? "train.eval_every_steps" : "train.eval_every_seconds";
  if (kind == ModelKind::kCount) {
    TROUPE_SETUP_ERROR("config: {}: the count model is checked against the counts once training is over, not "
                       "evaluated during it",
                       key);
  }
  const int64_t stages = c.getInt("pipeline.stages"), replicas = c.getInt("pipeline.replicas");
  if ((stages > 1 || replicas > 1) && c.getInt("cluster.workers") > 0) {
    TROUPE_SETUP_ERROR("config: {}: a pipeline across processes holds the model in pieces and evaluates it only "
                       "at the end",
                       key);
  }
  return out;
}

PipelineConfig pipelineOf(const Config& c) {
  PipelineConfig out;
  // In [1, 64], [1, 4096] and [1, 64]: the schema's ranges.
  const int64_t stages = c.getInt("pipeline.stages"), micro = c.getInt("pipeline.micro_batches");
  out.stages = int(stages);
  out.microBatches = int(micro);
  const int64_t replicas = c.getInt("pipeline.replicas");
  out.replicas = int(replicas);
  const std::string schedule = c.getString("pipeline.schedule");
  auto kind = pipelineScheduleOf(schedule);
  if (!kind) TROUPE_SETUP_ERROR("config: pipeline.schedule must be gpipe or 1f1b, got '{}'", schedule);
  out.schedule = *kind;
  const std::string cut = c.getString("pipeline.cut");
  if (!cut.empty()) {
    size_t at = 0;
    while (at <= cut.size()) {
      const size_t comma = std::min(cut.find(',', at), cut.size());
      const std::string item = cut.substr(at, comma - at);
      char* end = nullptr;
      const long v = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || end != item.c_str() + item.size() || v < 1 || v > 1 << 20 ||
          (!out.cut.empty() && v <= out.cut.back())) {
        TROUPE_SETUP_ERROR("config: pipeline.cut must list increasing layer numbers >= 1 (the first layer of each "
                           "stage after the first), got '{}'", cut);
      }
      out.cut.push_back(int(v));
      at = comma + 1;
    }
    if (int(out.cut.size()) != out.stages - 1) {
      TROUPE_SETUP_ERROR("config: pipeline.cut '{}' makes {} stages; pipeline.stages is {}", cut, out.cut.size() + 1,
                         out.stages);
    }
  }
  return out;
}

std::vector<int> pipelineCut(const PipelineConfig& p, const std::vector<int64_t>& widths) {
  const int layers = int(widths.size()) - 1;
  if (p.cut.empty()) return cutMlpLayers(widths, p.stages);
  if (p.cut.back() >= layers) {
    TROUPE_SETUP_ERROR("config: pipeline.cut starts a stage at layer {}; the MLP's layers are 0 to {}", p.cut.back(),
                       layers - 1);
  }
  std::vector<int> cut = {0};
  cut.insert(cut.end(), p.cut.begin(), p.cut.end());
  cut.push_back(layers);
  return cut;
}

CompressionConfig compressionOf(const Config& c) {
  CompressionConfig out;
  const double fraction = c.getFloat("compression.fraction");  // in (0, 1]: the schema's range
  const int64_t chunk = c.getInt("compression.chunk");  // in [1, 2^20]: the schema's range
  auto codec = [&](const char* key) {
    const std::string name = c.getString(key);
    auto kind = kernels::codecKindOf(name);
    if (!kind) {
      TROUPE_SETUP_ERROR("config: {} must be none, fp16, bf16, int8, onebit, topk or randomk, not '{}'", key, name);
    }
    kernels::CodecOptions o;
    o.kind = *kind;
    o.fraction = fraction;
    o.chunk = chunk;
    o.seed = uint64_t(c.getInt("run.seed"));
    return o;
  };
  out.push = codec("compression.push");
  out.pull = codec("compression.pull");
  out.allreduce = codec("compression.allreduce");
  if (out.pull.kind != kernels::CodecKind::kNone && out.pull.kind != kernels::CodecKind::kFp16 &&
      out.pull.kind != kernels::CodecKind::kBf16) {
    TROUPE_SETUP_ERROR("config: compression.pull carries weights, which only a cast keeps whole: none, fp16 or bf16, "
                       "not {}",
                       kernels::codecName(out.pull.kind));
  }
  out.warmupSteps = c.getInt("compression.warmup_steps");     // >= 0 and
  out.residualRows = c.getInt("compression.residual_rows");   // >= 0: the schema's ranges
  if (out.any() && c.getString("model.kind") == "count") {
    TROUPE_SETUP_ERROR("config: the count model checks every value exactly; compression would change them (set "
                       "compression.push, .pull and .allreduce to none)");
  }
  return out;
}

std::chrono::seconds pullWaitBound(const Config& c) {
  return std::chrono::seconds(2 * (positive(c, "supervision.stall_timeout_s") + positive(c, "supervision.replace_timeout_s")));
}

std::chrono::seconds collectivesTimeout(const Config& c) {
  auto t = std::chrono::seconds(positive(c, "collectives.timeout_s"));
  if (c.getString("supervision.on_worker_loss") != "fail") {
    t = std::min(t, std::chrono::seconds(std::max<int64_t>(1, positive(c, "supervision.stall_timeout_s") / 2)));
  }
  return t;
}

int64_t serverCount(const Config& c) {
  return trainMode(c) == TrainMode::kAllReduce ? 0 : c.getInt("cluster.servers");
}

int64_t psReplicas(const Config& c) {
  const int64_t r = c.getInt("ps.replicas");  // 1 or 2: the schema's range
  if (r == 2 && trainMode(c) == TrainMode::kAllReduce) {
    TROUPE_SETUP_ERROR("config: ps.replicas = 2 needs parameter servers (train.mode = ps or hybrid); allreduce mode "
                       "has none");
  }
  if (r == 2 && c.getInt("cluster.servers") < 2) {
    TROUPE_SETUP_ERROR("config: ps.replicas = 2 needs cluster.servers >= 2 (a shard's two copies live in two ps "
                       "processes); it is {}",
                       c.getInt("cluster.servers"));
  }
  return r;
}

}  // namespace troupe::workers
