#include "apps/train_command.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>

#include "apps/cli_common.h"
#include "apps/progress_line.h"
#include "apps/synthetic_cache.h"
#include "common/check.h"
#include "common/logging.h"
#include "data/criteo_reader.h"
#include "workers/trainer.h"

namespace troupe::apps {
namespace {

namespace fs = std::filesystem;

struct TrainFlags {
  CommonFlags common;
  std::string summaryJson;
  std::string predictions;
};

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

std::string jsonNumber(double v) { return std::isfinite(v) ? fmt::format("{:.17g}", v) : "null"; }

// What the data section names, opened as batch sources.
struct DataSources {
  std::shared_ptr<workers::BatchSource> train, test;
  std::string description;
  bool synthetic = false;
  double oracleAuc = std::nan(""), oracleLogloss = std::nan("");
};

DataSources openData(const Config& c, int threads) {
  DataSources d;
  const std::string kind = c.getString("data.kind");
  const std::string model = c.getString("model.kind");
  const int64_t batch = positive(c, "train.batch_size");
  auto check = [](auto&& opened) {
    if (!opened.hasValue()) TROUPE_SETUP_ERROR("{}", opened.status().message());
    return std::shared_ptr<workers::BatchSource>(std::move(*opened));
  };
  if (kind == "criteo-synthetic" || kind == "criteo") {
    if (model != "dlrm") TROUPE_SETUP_ERROR("config: data.kind '{}' needs model.kind 'dlrm', got '{}'", kind, model);
    std::string trainPath = c.getString("data.train"), testPath = c.getString("data.test");
    int categorical = int(c.getInt("data.categorical"));
    if (kind == "criteo-synthetic") {
      auto set = ensureSyntheticData(c, "", false, threads);
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
    workers::CriteoSourceOptions o;
    o.batchSize = batch;
    o.numCategorical = categorical;
    o.skipBadLines = c.getBool("data.skip_bad_lines");
    o.inMemory = c.getBool("data.in_memory");
    o.path = trainPath;
    o.maxRows = c.getInt("data.max_train_rows");
    d.train = check(workers::openCriteoSource(o));
    o.path = testPath;
    o.inMemory = true;
    o.maxRows = -1;
    d.test = check(workers::openCriteoSource(o));
    d.description = fmt::format("{} ({}, {})", kind, trainPath, testPath);
  } else if (kind == "fashion-mnist") {
    if (model != "mlp") TROUPE_SETUP_ERROR("config: data.kind 'fashion-mnist' needs model.kind 'mlp', got '{}'", model);
    std::string dir = c.getString("data.train");
    if (dir.empty()) dir = "/usr/share/datasets/fashion-mnist";
    workers::MnistSourceOptions o;
    o.batchSize = batch;
    o.seed = uint64_t(c.getInt("run.seed"));
    o.imagesPath = dir + "/train-images-idx3-ubyte.gz";
    o.labelsPath = dir + "/train-labels-idx1-ubyte.gz";
    d.train = check(workers::openMnistSource(o));
    o.shuffle = false;
    o.imagesPath = dir + "/t10k-images-idx3-ubyte.gz";
    o.labelsPath = dir + "/t10k-labels-idx1-ubyte.gz";
    d.test = check(workers::openMnistSource(o));
    d.description = fmt::format("fashion-mnist ({})", dir);
  } else {
    TROUPE_SETUP_ERROR("config: data.kind '{}' cannot be trained on (criteo-synthetic, criteo, fashion-mnist)", kind);
  }
  return d;
}

workers::WorkerCoreOptions modelOptions(const Config& c, int threads) {
  workers::WorkerCoreOptions o;
  const std::string kind = c.getString("model.kind");
  o.seed = uint64_t(c.getInt("run.seed"));
  o.threads = threads;
  o.denseOptimizer.kind = optimizerKind(c.getString("train.dense_optimizer"), "train.dense_optimizer");
  o.denseOptimizer.learningRate = float(c.getFloat("train.dense_lr"));
  o.denseOptimizer.weightDecay = float(c.getFloat("train.weight_decay"));
  o.denseOptimizer.initialAccumulator = float(c.getFloat("train.adagrad_initial_accumulator"));
  if (kind == "dlrm") {
    o.kind = workers::ModelKind::kDlrm;
    o.dlrm.embeddingDim = positive(c, "model.embedding_dim");
    o.dlrm.bottom = c.getIntList("model.bottom_mlp");
    o.dlrm.top = c.getIntList("model.top_mlp");
    o.dlrm.concatEmbeddings = c.getBool("model.concat_embeddings");
    o.dlrm.numTables = int(c.getString("data.kind") == "criteo-synthetic" ? c.getInt("data.synthetic.tables")
                                                                           : c.getInt("data.categorical"));
    o.dlrm.numDense = data::kCriteoIntFeatures;
  } else if (kind == "mlp") {
    o.kind = workers::ModelKind::kMlp;
    o.mlpWidths = {784};
    for (int64_t w : c.getIntList("model.hidden")) o.mlpWidths.push_back(w);
    o.mlpWidths.push_back(positive(c, "model.classes"));
  } else {
    TROUPE_SETUP_ERROR("config: model.kind '{}' is not a model (dlrm, mlp)", kind);
  }
  return o;
}

std::string makeRunDir(const Config& c) {
  std::string name = c.getString("run.name");
  if (name.empty()) {
    std::time_t now = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    name = fmt::format("{}-{}", stamp, c.getString("model.kind"));
  }
  fs::path dir = fs::path(c.getString("run.dir")) / name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) TROUPE_SETUP_ERROR("cannot create run directory '{}': {}", dir.string(), ec.message());
  return dir.string();
}

int runTrain(const TrainFlags& flags) {
  const auto wallStart = std::chrono::steady_clock::now();
  Config config = loadConfig(flags.common);
  const int threads = resolveThreads(config);
  workers::WorkerOptions worker;
  worker.core = modelOptions(config, threads);
  worker.epochs = positive(config, "train.epochs");
  worker.maxSteps = config.getInt("train.max_steps");
  worker.progressEverySteps = positive(config, "train.progress_every");
  worker.evaluateEachEpoch = config.getBool("train.eval_each_epoch");
  worker.lrDecayPerEpoch = config.getFloat("train.lr_decay");
  if (!(worker.lrDecayPerEpoch > 0 && worker.lrDecayPerEpoch <= 1)) {
    TROUPE_SETUP_ERROR("config: train.lr_decay must be in (0, 1], got {}", worker.lrDecayPerEpoch);
  }
  const kernels::OptimizerKind embeddingKind =
      optimizerKind(config.getString("train.embedding_optimizer"), "train.embedding_optimizer");

  const std::string runDir = makeRunDir(config);
  { std::ofstream(runDir + "/config.toml") << config.toToml(); }
  addLogFile(runDir + "/train.log");
  auto log = logger("apps");
  DataSources data = openData(config, threads);
  log->info("train: {} on {}, {} threads, run directory {}", config.getString("model.kind"), data.description,
            threads, runDir);

  workers::InProcessJob job;
  job.train = data.train;
  job.test = data.test;
  job.prefetch = int(positive(config, "data.prefetch"));
  if (worker.core.kind == workers::ModelKind::kDlrm) {
    for (int t = 0; t < worker.core.dlrm.numTables; ++t) {
      ps::EmbeddingTableOptions table;
      table.tableId = t;
      table.dim = worker.core.dlrm.embeddingDim;
      table.seed = worker.core.seed;
      table.initScale = float(config.getFloat("model.embedding_init_scale"));
      table.optimizer.kind = embeddingKind;
      table.optimizer.learningRate = float(config.getFloat("train.embedding_lr"));
      table.optimizer.initialAccumulator = float(config.getFloat("train.adagrad_initial_accumulator"));
      job.tables.tables.push_back(table);
    }
    job.tables.threads = threads;
  }

  std::ofstream metrics(runDir + "/metrics.csv");
  metrics << "epoch,step,elapsed_s,rows,loss,auc,accuracy\n";
  ProgressLine progress("train", "rows");
  const int64_t epochs = worker.epochs;
  worker.onEvent = [&](const workers::WorkerEvent& e) {
    if (e.kind == workers::WorkerEvent::Kind::kProgress) {
      const int64_t total = e.rowsPerEpoch * epochs;
      const int64_t done = e.rowsPerEpoch * e.epoch + e.epochRows;
      progress.update(done, total,
                      fmt::format("epoch {}/{}  step {}  loss {:.4f}  {:.0f} samples/s", e.epoch + 1, epochs, e.step,
                                  e.meanLoss, e.samplesPerSec));
      return;
    }
    progress.finish();
    const auto& r = *e.eval;
    if (worker.core.kind == workers::ModelKind::kDlrm) {
      log->info("eval after epoch {} (step {}): test AUC {:.5f}  log-loss {:.5f}{}", e.epoch + 1, e.step, r.auc,
                r.loss,
                data.synthetic ? fmt::format("  (oracle AUC {:.5f}, log-loss {:.5f})", data.oracleAuc,
                                             data.oracleLogloss)
                               : "");
    } else {
      log->info("eval after epoch {} (step {}): test accuracy {:.4f}  loss {:.4f}", e.epoch + 1, e.step, r.accuracy,
                r.loss);
    }
    metrics << fmt::format("{},{},{:.3f},{},{},{},{}\n", e.epoch + 1, e.step, e.elapsedSec, r.rows,
                           jsonNumber(r.loss), jsonNumber(r.auc), jsonNumber(r.accuracy));
    metrics.flush();
  };

  job.worker = worker;
  auto report = workers::runInProcess(job);
  progress.finish();
  if (!report.hasValue()) {
    std::fprintf(stderr, "troupe: error: train: %s\n", report.status().message().c_str());
    return kExitFailure;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wallStart).count();
  const workers::EvalResult last = report->evals.empty() ? workers::EvalResult{} : report->evals.back();
  const double samplesPerSec = report->trainSeconds > 0 ? double(report->samples) / report->trainSeconds : 0;
  const bool binary = worker.core.kind == workers::ModelKind::kDlrm;

  std::string json = "{\n";
  auto field = [&](const std::string& k, const std::string& v) { json += fmt::format("  \"{}\": {},\n", k, v); };
  field("model", fmt::format("\"{}\"", config.getString("model.kind")));
  if (binary) {
    field("test_auc", jsonNumber(last.auc));
    field("test_logloss", jsonNumber(last.loss));
    if (data.synthetic) {
      field("oracle_auc", jsonNumber(data.oracleAuc));
      field("oracle_logloss", jsonNumber(data.oracleLogloss));
    }
  } else {
    field("test_accuracy", jsonNumber(last.accuracy));
    field("test_loss", jsonNumber(last.loss));
  }
  field("test_rows", std::to_string(last.rows));
  field("samples_per_sec", jsonNumber(samplesPerSec));
  field("train_seconds", jsonNumber(report->trainSeconds));
  field("eval_seconds", jsonNumber(report->evalSeconds));
  field("wall_seconds", jsonNumber(wall));
  field("steps", std::to_string(report->steps));
  field("samples", std::to_string(report->samples));
  field("epochs", std::to_string(epochs));
  field("batch_size", std::to_string(config.getInt("train.batch_size")));
  field("threads", std::to_string(threads));
  field("dense_parameters", std::to_string(report->denseWeights.size()));
  field("dense_macs_per_sample", std::to_string(report->macsPerSample));
  if (binary) {
    field("embedding_rows_per_sample",
          jsonNumber(report->samples ? double(report->pulledRows) / double(report->samples) : 0.0));
    field("embedding_dim", std::to_string(worker.core.dlrm.embeddingDim));
    field("embedding_optimizer", fmt::format("\"{}\"", config.getString("train.embedding_optimizer")));
  }
  json += fmt::format("  \"run_dir\": \"{}\"\n}}\n", runDir);
  { std::ofstream(runDir + "/summary.json") << json; }
  if (!flags.summaryJson.empty()) {
    std::ofstream out(flags.summaryJson);
    out << json;
    if (!out) TROUPE_SETUP_ERROR("cannot write --summary-json '{}'", flags.summaryJson);
  }
  if (!flags.predictions.empty()) {
    std::FILE* f = std::fopen(flags.predictions.c_str(), "w");
    if (!f) TROUPE_SETUP_ERROR("cannot write --predictions '{}'", flags.predictions);
    for (size_t i = 0; i < last.labels.size(); ++i) {
      if (binary) {
        std::fprintf(f, "%d\t%.9g\n", int(last.labels[i]), last.predictions[i]);
      } else {
        std::fprintf(f, "%d\t%d\n", int(last.labels[i]), int(last.predictions[i]));
      }
    }
    std::fclose(f);
  }
  if (binary) {
    std::printf("test AUC %.5f  log-loss %.5f", last.auc, last.loss);
    if (data.synthetic) std::printf("   oracle AUC %.5f  log-loss %.5f", data.oracleAuc, data.oracleLogloss);
    std::printf("\n");
  } else {
    std::printf("test accuracy %.4f  loss %.4f\n", last.accuracy, last.loss);
  }
  std::printf("%lld steps, %.0f samples/s, %.1f s training, %.1f s wall; run directory %s\n",
              static_cast<long long>(report->steps), samplesPerSec, report->trainSeconds, wall, runDir.c_str());
  return kExitOk;
}

}  // namespace

void addTrainCommand(CLI::App* app, int* result) {
  auto flags = std::make_shared<TrainFlags>();
  auto* cmd = app->add_subcommand("train", "Train a model (one process, every role an actor)");
  addCommonFlags(cmd, &flags->common);
  cmd->add_option("--summary-json", flags->summaryJson, "write the run's summary (metrics, speed) as JSON here");
  cmd->add_option("--predictions", flags->predictions,
                  "write the test predictions here: true label, a tab, the predicted probability or class");
  cmd->callback([=] { *result = runGuarded([&] { return runTrain(*flags); }); });
}

}  // namespace troupe::apps
