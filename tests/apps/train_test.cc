// `troupe train` as a user runs it: small DLRM and MLP jobs that must learn,
// bit-for-bit determinism, the run directory, and bad configurations.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/common/subprocess.h"
#include "tests/common/temp_dir.h"

namespace troupe {
namespace {

using testing::ProcessResult;
using testing::readFile;
using testing::runProcess;
using testing::TempDir;
using testing::writeFile;

ProcessResult troupe(std::vector<std::string> args) {
  args.insert(args.begin(), TROUPE_BINARY);
  return runProcess(args, std::chrono::seconds(150));
}

// A number field of a summary.json; NaN when absent.
double field(const std::string& json, const std::string& key) {
  auto pos = json.find("\"" + key + "\": ");
  if (pos == std::string::npos) return std::nan("");
  return std::strtod(json.c_str() + pos + key.size() + 4, nullptr);
}

std::vector<std::string> smallDlrm(const TempDir& dir, const std::string& run) {
  return {"train", "--config", std::string(TROUPE_SOURCE_ROOT) + "/configs/dlrm-synthetic.toml",
          "--set", "data.synthetic.rows=40000", "--set", "data.synthetic.test_rows=8000",
          "--set", "data.synthetic.tables=8", "--set", "data.synthetic.max_vocab=2000",
          "--set", "data.cache_dir=" + dir.file("cache"), "--set", "run.dir=" + dir.file("runs"),
          "--set", "run.name=" + run, "--set", "train.epochs=2", "--set", "train.batch_size=128",
          "--summary-json", dir.file(run + ".json"), "--predictions", dir.file(run + ".tsv")};
}

TEST(TrainTest, SmallDlrmLearnsAndKeepsARunDirectory) {
  TempDir dir;
  auto r = troupe(smallDlrm(dir, "a"));
  ASSERT_EQ(r.exitCode, 0) << r.err;
  const std::string json = readFile(dir.file("a.json"));
  const double auc = field(json, "test_auc"), oracle = field(json, "oracle_auc");
  // An untrained model scores ~0.5; the planted model is the ceiling.
  EXPECT_GT(auc, 0.70) << json;
  EXPECT_LT(auc, oracle + 0.01) << json;
  // Better than predicting the base rate (log-loss of a constant ~0.56 at CTR 0.25).
  EXPECT_LT(field(json, "test_logloss"), 0.54) << json;
  EXPECT_EQ(field(json, "steps"), 2 * (40000 / 128 + 1)) << json;
  EXPECT_GT(field(json, "samples_per_sec"), 0) << json;
  EXPECT_GT(field(json, "wall_seconds"), 0) << json;
  // One prediction line per test row: label, tab, probability.
  const std::string preds = readFile(dir.file("a.tsv"));
  size_t lines = 0;
  for (char c : preds) lines += c == '\n';
  EXPECT_EQ(lines, 8000u);
  EXPECT_TRUE(preds.rfind("0\t", 0) == 0 || preds.rfind("1\t", 0) == 0) << preds.substr(0, 40);
  // Run directory: the config used, one metrics row per evaluation, the log.
  const std::string run = dir.file("runs/a");
  EXPECT_NE(readFile(run + "/config.toml").find("max_vocab = 2000"), std::string::npos);
  const std::string metrics = readFile(run + "/metrics.csv");
  size_t rows = 0;
  for (char c : metrics) rows += c == '\n';
  EXPECT_EQ(rows, 3u) << metrics;  // header + 2 epochs
  EXPECT_NE(readFile(run + "/train.log").find("eval after epoch 2"), std::string::npos);
  EXPECT_EQ(readFile(run + "/summary.json"), json);
}

TEST(TrainTest, SameConfigAndSeedGiveTheSameBits) {
  TempDir dir;
  auto a = troupe(smallDlrm(dir, "a"));
  ASSERT_EQ(a.exitCode, 0) << a.err;
  auto b = troupe(smallDlrm(dir, "b"));
  ASSERT_EQ(b.exitCode, 0) << b.err;
  EXPECT_EQ(readFile(dir.file("a.tsv")), readFile(dir.file("b.tsv")));
  EXPECT_EQ(field(readFile(dir.file("a.json")), "test_auc"), field(readFile(dir.file("b.json")), "test_auc"));
  // Another seed trains another model.
  auto args = smallDlrm(dir, "c");
  args.insert(args.end(), {"--set", "run.seed=2"});
  auto c = troupe(args);
  ASSERT_EQ(c.exitCode, 0) << c.err;
  EXPECT_NE(readFile(dir.file("a.tsv")), readFile(dir.file("c.tsv")));
}

TEST(TrainTest, SmallMlpOnFashionMnistLearns) {
  TempDir dir;
  auto r = troupe({"train", "--config", std::string(TROUPE_SOURCE_ROOT) + "/configs/mlp-fashion-mnist.toml",
                   "--set", "train.max_steps=300", "--set", "run.dir=" + dir.file("runs"), "--summary-json",
                   dir.file("s.json"), "--predictions", dir.file("p.tsv")});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  const std::string json = readFile(dir.file("s.json"));
  EXPECT_GT(field(json, "test_accuracy"), 0.75) << json;  // 10 classes: untrained ~0.1
  EXPECT_EQ(field(json, "steps"), 300) << json;
  EXPECT_EQ(field(json, "test_rows"), 10000) << json;
  const std::string preds = readFile(dir.file("p.tsv"));
  EXPECT_EQ(preds.find('.'), std::string::npos) << "classes, not probabilities";
}

// train.eval_every_steps: the evaluator beside the worker evaluates a copy
// of the model at each due step while training goes on. Its point at step
// 60 is the model of step 60 exactly: the final evaluation of a run that
// stops there (one thread each, so both sum alike) gives the same metrics.
// Every snapshot is evaluated or replaced before the run ends, and the
// evaluation leaves training as it was (the same final model).
// The MLP on Fashion-MNIST with one thread, as run `name` under dir/runs
// with these --set overrides; its summary is dir/<name>.json.
ProcessResult trainMlp(const TempDir& dir, const std::string& name, const std::vector<std::string>& sets) {
  std::vector<std::string> args = {"train", "--config",
                                   std::string(TROUPE_SOURCE_ROOT) + "/configs/mlp-fashion-mnist.toml",
                                   "--threads", "1", "--set", "run.dir=" + dir.file("runs"), "--set",
                                   "run.name=" + name, "--summary-json", dir.file(name + ".json")};
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  auto r = troupe(args);
  EXPECT_EQ(r.exitCode, 0) << r.err;
  return r;
}

TEST(TrainTest, EvaluationsDuringTrainingAreOfTheModelAtTheirStep) {
  TempDir dir;
  auto run = [&](const std::string& name, const std::vector<std::string>& sets) {
    trainMlp(dir, name, sets);
    return readFile(dir.file(name + ".json"));
  };
  const std::string during = run("during", {"train.max_steps=200", "train.eval_every_steps=60"});
  const std::string at60 = run("at60", {"train.max_steps=60"});
  const std::string plain = run("plain", {"train.max_steps=200"});
  // metrics.csv: the points during training, then the final evaluation.
  const auto rows = testing::readMetricsCsv(dir.file("runs/during/metrics.csv"));
  const auto summary = nlohmann::json::parse(during);
  const int64_t points = summary.at("evaluations_during_training").at("points").get<int64_t>();
  const int64_t replaced = summary.at("evaluations_during_training").at("snapshots_replaced").get<int64_t>();
  EXPECT_EQ(points + replaced, 3) << during;  // steps 60, 120, 180
  ASSERT_EQ(int64_t(rows.size()), points + 1) << readFile(dir.file("runs/during/metrics.csv"));
  // The first snapshot finds the evaluator idle: never replaced.
  EXPECT_EQ(rows[0][1], "60");
  EXPECT_EQ(rows[0][3], "10000");
  EXPECT_EQ(rows[0][7], std::to_string(60 * 128));
  EXPECT_EQ(std::stod(rows[0][6]), field(at60, "test_accuracy")) << at60;
  EXPECT_EQ(std::stod(rows[0][4]), field(at60, "test_loss")) << at60;
  for (size_t i = 0; i + 1 < rows.size(); ++i) EXPECT_EQ(std::stoll(rows[i][1]) % 60, 0) << rows[i][1];
  EXPECT_EQ(rows.back()[1], "200");
  EXPECT_EQ(std::stod(rows.back()[6]), field(during, "test_accuracy"));
  // Training went as it does without evaluations.
  EXPECT_EQ(summary.at("dense_hash"), nlohmann::json::parse(plain).at("dense_hash"));
  EXPECT_EQ(field(during, "test_accuracy"), field(plain, "test_accuracy"));
}

// train.profile: every kernel call of training is counted (the MLP
// 784-256-128-10 takes 3 dense layers, 2 ReLUs and a loss a step), in both
// epochs (the count goes on after the evaluation between them), none of the
// evaluations' (after each epoch, and during training), and training goes
// as it does unprofiled.
TEST(TrainTest, TheProfileCountsEveryKernelCallOfTrainingAndChangesNothing) {
  TempDir dir;
  auto run = [&](const std::string& name, std::vector<std::string> sets) {
    sets.insert(sets.end(), {"data.max_train_rows=6400", "train.epochs=2", "train.eval_every_steps=20"});
    return trainMlp(dir, name, sets);
  };
  auto profiled = run("profiled", {"train.profile=true"});
  run("plain", {});
  const auto summary = nlohmann::json::parse(readFile(dir.file("profiled.json")));
  std::map<std::string, int64_t> calls;
  double seconds = 0;
  for (const auto& e : summary.at("kernel_profile")) {
    calls[e.at("kernel").get<std::string>()] = e.at("calls").get<int64_t>();
    seconds += e.at("seconds").get<double>();
    EXPECT_GE(e.at("seconds").get<double>(), 0) << e;
    EXPECT_GT(e.at("wall_seconds").get<double>(), 0) << e;
    EXPECT_LE(e.at("wall_seconds").get<double>(), e.at("seconds").get<double>() + 1e-9) << e;
    EXPECT_LE(e.at("wall_seconds").get<double>(), summary.at("kernel_wall_seconds").get<double>() + 1e-9) << e;
  }
  // On one thread the calls never overlap: the wall time is the summed time.
  EXPECT_NEAR(summary.at("kernel_wall_seconds").get<double>(), seconds, 1e-6 + 1e-3 * seconds) << summary;
  ASSERT_EQ(summary.at("steps").get<int64_t>(), 100) << summary;  // 2 epochs of 6400 rows in batches of 128
  EXPECT_EQ(calls["denseForward"], 100 * 3) << summary.at("kernel_profile");
  EXPECT_EQ(calls["denseBackward"], 100 * 3);
  EXPECT_EQ(calls["reluForward"], 100 * 2);
  EXPECT_EQ(calls["reluBackward"], 100 * 2);
  EXPECT_EQ(calls["softmaxCrossEntropy"], 100);
  EXPECT_EQ(calls.count("embeddingBagForward"), 0u);  // the MLP has no tables
  EXPECT_GT(seconds, 0);
  EXPECT_LE(seconds, field(readFile(dir.file("profiled.json")), "train_seconds") * 1.01);  // one thread
  EXPECT_NE(profiled.out.find("kernel profile (1 threads"), std::string::npos) << profiled.out;
  const auto plain = nlohmann::json::parse(readFile(dir.file("plain.json")));
  EXPECT_EQ(summary.at("dense_hash"), plain.at("dense_hash"));
  EXPECT_FALSE(plain.contains("kernel_profile"));
  // One process's only: a job of processes is refused, naming the key.
  auto job = troupe({"train", "--config", std::string(TROUPE_SOURCE_ROOT) + "/configs/mlp-fashion-mnist.toml",
                     "--set", "train.profile=true", "--set", "cluster.workers=1", "--set",
                     "run.dir=" + dir.file("runs")});
  EXPECT_EQ(job.exitCode, 2) << job.err;
  EXPECT_NE(job.err.find("train.profile"), std::string::npos) << job.err;
}

// summary.json is JSON whatever the user called things: a run.dir and a
// run.name with a double quote, a backslash and non-ASCII UTF-8 parse back
// byte for byte (run_dir joins the two), as the same file in the run
// directory. A name that is not UTF-8 at all is refused before anything
// runs (it could not be written into the run's config.toml and read back).
TEST(TrainTest, TheSummaryIsJsonWhateverTheRunIsCalled) {
  TempDir dir;
  const std::string runs = dir.file("runs \"in\\ \xc3\xa9t\xc3\xa9");  // runs "in\ été
  auto summaryOf = [&](const std::string& name) {
    auto r = troupe({"train", "--config", std::string(TROUPE_SOURCE_ROOT) + "/configs/mlp-fashion-mnist.toml",
                     "--threads", "1", "--set", "train.max_steps=5", "--set", "run.dir=" + runs, "--set",
                     "run.name=" + name, "--summary-json", dir.file("s.json")});
    EXPECT_EQ(r.exitCode, 0) << r.err;
    const std::string text = readFile(dir.file("s.json"));
    EXPECT_EQ(readFile(runs + "/" + name + "/summary.json"), text);
    nlohmann::json summary;
    EXPECT_NO_THROW(summary = nlohmann::json::parse(text)) << text;
    return summary;
  };
  const std::string name = "q\"b\\\xc3\xbc\xe2\x9c\x93";  // q"b\ü✓
  const auto summary = summaryOf(name);
  ASSERT_TRUE(summary.is_object() && summary.contains("run_dir") && summary.at("run_dir").is_string()) << summary;
  EXPECT_EQ(summary.at("run_dir").get<std::string>(), runs + "/" + name) << summary;
  EXPECT_EQ(summary.at("steps"), 5) << summary;
  EXPECT_EQ(summary.at("model"), "mlp") << summary;
  auto latin1 = troupe({"train", "--config", std::string(TROUPE_SOURCE_ROOT) + "/configs/mlp-fashion-mnist.toml",
                        "--set", "run.dir=" + runs, "--set", "run.name=caf\xe9"});  // "café" in Latin-1
  EXPECT_EQ(latin1.exitCode, 2) << latin1.err;
  EXPECT_EQ(latin1.err, "troupe: error: config: --set: run.name must be UTF-8 text; its value is not\n");
  EXPECT_FALSE(std::filesystem::exists(runs + "/caf\xe9"));
}

// pipeline.stages: the MLP cut into stage actors learns, and since every
// schedule and cut accumulates the micro-batches in the same order, two
// stages under 1f1b and four under gpipe predict exactly alike (the bits
// themselves are held to the unsplit model in workers_pipeline_test).
TEST(TrainTest, APipelinedMlpLearnsAndEveryCutPredictsAlike) {
  TempDir dir;
  auto run = [&](const std::string& name, std::vector<std::string> sets) {
    std::vector<std::string> args = {"train", "--config",
                                     std::string(TROUPE_SOURCE_ROOT) + "/configs/mlp-fashion-mnist.toml", "--set",
                                     "train.max_steps=300", "--set", "model.hidden=[128, 64, 32]", "--set",
                                     // one thread a stage in both runs: the same GEMM blocking, the same bits
                                     "run.threads=1", "--set",
                                     "run.dir=" + dir.file("runs"), "--summary-json", dir.file(name + ".json"),
                                     "--predictions", dir.file(name + ".tsv")};
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    auto r = troupe(args);
    EXPECT_EQ(r.exitCode, 0) << name << ": " << r.err;
    return r;
  };
  auto two = run("two", {"pipeline.stages=2", "pipeline.micro_batches=4", "pipeline.schedule=1f1b"});
  EXPECT_NE(two.err.find("the MLP in 2 pipeline stages (layers 0-0, layers 1-3), 4 micro-batches a batch, schedule "
                         "1f1b"),
            std::string::npos)
      << two.err;
  run("four", {"pipeline.stages=4", "pipeline.micro_batches=4", "pipeline.schedule=gpipe"});
  // Two replicas of two stages, each on half of every batch: it learns too.
  auto replicas = run("replicas", {"pipeline.stages=2", "pipeline.replicas=2", "pipeline.micro_batches=2"});
  EXPECT_NE(replicas.err.find("2 replicas (data parallel)"), std::string::npos) << replicas.err;
  EXPECT_GT(field(readFile(dir.file("replicas.json")), "test_accuracy"), 0.75);
  // Whole epochs whose last batch (1025 = 8 x 128 + 1 rows) is shorter than
  // the replicas: one replica's share and its micro-batches are empty, and
  // the run goes on.
  auto shortRun = run("short", {"data.max_train_rows=1025", "train.max_steps=0", "train.epochs=2", "pipeline.stages=2",
                                "pipeline.replicas=2", "pipeline.micro_batches=4"});
  ASSERT_EQ(shortRun.exitCode, 0);
  EXPECT_EQ(field(readFile(dir.file("short.json")), "steps"), 18) << "9 batches an epoch, 2 epochs";
  const std::string json = readFile(dir.file("two.json"));
  EXPECT_GT(field(json, "test_accuracy"), 0.75) << json;
  EXPECT_EQ(field(json, "steps"), 300) << json;
  EXPECT_TRUE(readFile(dir.file("two.tsv")) == readFile(dir.file("four.tsv")))
      << "two stages (1f1b) and four (gpipe) predict alike";
  EXPECT_EQ(field(json, "test_accuracy"), field(readFile(dir.file("four.json")), "test_accuracy"));
  // What the MLP's pipeline refuses before it starts, in one line.
  struct Case {
    std::vector<std::string> sets;
    std::string needle;
  };
  for (const Case& c : {Case{{"pipeline.stages=5"}, "pipeline: 5 stages for an MLP of 4 layers"},
                        Case{{"pipeline.stages=2", "pipeline.cut=4"}, "pipeline.cut starts a stage at layer 4; the "
                                                                       "MLP's layers are 0 to 3"},
                        Case{{"pipeline.stages=2", "train.batch_size=2"}, "pipeline.micro_batches = 4 a replica of 1 "
                                                                           "cuts each batch of train.batch_size = 2"},
                        Case{{"pipeline.stages=2", "cluster.workers=4"}, "needs cluster.workers = 2 (a stage a process), not 4"}}) {
    std::vector<std::string> args = {"train", "--config",
                                     std::string(TROUPE_SOURCE_ROOT) + "/configs/mlp-fashion-mnist.toml", "--set",
                                     "model.hidden=[128, 64, 32]", "--set", "run.dir=" + dir.file("runs")};
    for (const auto& x : c.sets) args.insert(args.end(), {"--set", x});
    auto r = troupe(args);
    EXPECT_EQ(r.exitCode, 2) << c.needle << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << "wanted '" << c.needle << "' in: " << r.err;
  }
}

// pipeline.stages = 2 cuts the DLRM into its bottom MLP (with the
// embeddings, in the worker) and its interaction and top MLP: one
// micro-batch a batch is the unsplit model, bit for bit (the same
// predictions at one thread, held for every weight in
// workers_pipeline_test); four micro-batches learn as well.
TEST(TrainTest, ADlrmInTwoStagesPredictsAsTheUnsplitOne) {
  TempDir dir;
  auto run = [&](const std::string& name, std::vector<std::string> sets) {
    auto args = smallDlrm(dir, name);
    args.insert(args.end(), {"--set", "run.threads=1", "--set", "train.epochs=1"});
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    auto r = troupe(args);
    EXPECT_EQ(r.exitCode, 0) << name << ": " << r.err;
    return r;
  };
  run("whole", {});
  auto one = run("one", {"pipeline.stages=2", "pipeline.micro_batches=1"});
  EXPECT_NE(one.err.find("the DLRM in 2 pipeline stages (the embeddings and the bottom MLP, the interaction and the "
                         "top MLP), 1 micro-batches a batch"),
            std::string::npos)
      << one.err;
  EXPECT_TRUE(readFile(dir.file("whole.tsv")) == readFile(dir.file("one.tsv")))
      << "one micro-batch: the unsplit model's predictions";
  run("four", {"pipeline.stages=2", "pipeline.micro_batches=4", "pipeline.schedule=gpipe"});
  const double whole = field(readFile(dir.file("whole.json")), "test_auc");
  const double four = field(readFile(dir.file("four.json")), "test_auc");
  EXPECT_GT(whole, 0.70);
  EXPECT_NEAR(four, whole, 0.002) << "four micro-batches: the same sums in another order";
  // What the DLRM's pipeline refuses, in one line.
  for (const auto& [sets, needle] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"pipeline.stages=3"}, "the DLRM is cut into 2 stages"},
           {{"pipeline.stages=2", "pipeline.cut=1"}, "the DLRM is cut into 2 stages"},
           {{"pipeline.stages=2", "cluster.workers=2", "train.mode=allreduce"},
            "the DLRM's stages run in one process today"}}) {
    auto args = smallDlrm(dir, "bad");
    for (const auto& x : sets) args.insert(args.end(), {"--set", x});
    auto r = troupe(args);
    EXPECT_EQ(r.exitCode, 2) << needle << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << r.err;
  }
}

// troupe experiment: a 2 x 2 grid of short MLP runs, one setting of which
// fails (its data directory does not exist): every run is a row of experiment.csv (the failed
// ones saying why), the plots are PNGs, report.md shows them, and the
// command says a run failed.
TEST(ExperimentTest, AGridOfRunsWritesTheTablePlotsAndReportAndAFailedRunIsARowSayingWhy) {
  TempDir dir;
  auto r = troupe({"experiment", "--config", std::string(TROUPE_SOURCE_ROOT) + "/configs/mlp-fashion-mnist.toml",
                   "--set", "train.epochs=2", "--set", "data.max_train_rows=2000", "--set", "run.threads=1", "--set",
                   "train.batch_size=64", "--sweep", "pipeline.stages=1,2", "--sweep", "data.train=/usr/share/datasets/fashion-mnist,/nonexistent", "--target", "accuracy=0.3", "--out",
                   dir.file("exp")});
  EXPECT_EQ(r.exitCode, 1) << r.out << r.err;  // a run failed
  EXPECT_NE(r.out.find("experiment: 4 runs, 2 failed"), std::string::npos) << r.out;
  std::istringstream csv(readFile(dir.file("exp/experiment.csv")));
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "run,pipeline.stages,data.train,repeat,seed,status,metric,final,best,loss,time_to_target_s,"
                    "steps_to_target,samples_per_sec,train_seconds,wall_seconds,steps,samples,staleness_mean,"
                    "staleness_p50,staleness_p99,staleness_max,pull_wait_fraction,collective_fraction,wire_bytes");
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(csv, line);) {
    std::vector<std::string> cells;
    std::string cell;
    bool quoted = false;
    for (char c : line) {
      if (c == '"') {
        quoted = !quoted;
      } else if (c == ',' && !quoted) {
        cells.push_back(cell);
        cell.clear();
      } else {
        cell += c;
      }
    }
    cells.push_back(cell);
    rows.push_back(cells);
  }
  ASSERT_EQ(rows.size(), 4u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    ASSERT_EQ(row.size(), 24u) << "row " << i;
    EXPECT_EQ(row[0], std::to_string(i));
    EXPECT_EQ(row[1], i < 2 ? "1" : "2") << "the first sweep varies slowest";
    EXPECT_EQ(row[2], i % 2 == 0 ? "/usr/share/datasets/fashion-mnist" : "/nonexistent");
    EXPECT_EQ(row[4], "1") << "the config's run.seed";
    if (i % 2 == 1) {
      EXPECT_EQ(row[5], "cannot open '/nonexistent/train-images-idx3-ubyte.gz': No such file or directory") << "row " << i;
      EXPECT_EQ(row[7], "");
      continue;
    }
    EXPECT_EQ(row[5], "ok");
    EXPECT_EQ(row[6], "accuracy");
    EXPECT_GT(std::strtod(row[7].c_str(), nullptr), 0.3);
    EXPECT_NE(row[10], "") << "the first evaluation past 0.3: a time";
    EXPECT_EQ(row[11], "32") << "the first epoch's evaluation (2000 rows: 32 batches of 64)";
    EXPECT_EQ(row[15], "64") << "2 epochs x 32 batches";
    EXPECT_EQ(row[16], "4000");
  }
  for (const std::string png : {"metric.png", "rate.png", "target.png", "curves.png", "curves-samples.png"}) {
    const std::string bytes = readFile(dir.file("exp/" + png));
    EXPECT_EQ(bytes.substr(0, 4), "\x89PNG") << png;
  }
  const std::string report = readFile(dir.file("exp/report.md"));
  EXPECT_NE(report.find("![curves.png](curves.png)"), std::string::npos) << report;
  EXPECT_NE(report.find("| 1 | pipeline.stages=1 data.train=/nonexistent | cannot open "
                        "'/nonexistent/train-images-idx3-ubyte.gz': No such file or directory |"),
            std::string::npos)
      << report;
  // A bad sweep is one line, before any run.
  auto bad = troupe({"experiment", "--config", std::string(TROUPE_SOURCE_ROOT) + "/configs/mlp-fashion-mnist.toml",
                     "--sweep", "pipeline.stages", "--out", dir.file("bad")});
  EXPECT_EQ(bad.exitCode, 2) << bad.err;
  EXPECT_NE(bad.err.find("--sweep 'pipeline.stages': give KEY=V1,V2,..."), std::string::npos) << bad.err;
  // So is a key no config has, before any run.
  auto typo = troupe({"experiment", "--config", std::string(TROUPE_SOURCE_ROOT) + "/configs/mlp-fashion-mnist.toml",
                      "--sweep", "ps.consistancy=bsp,asp", "--out", dir.file("typo")});
  EXPECT_EQ(typo.exitCode, 2) << typo.err;
  EXPECT_NE(typo.err.find("ps.consistancy"), std::string::npos) << typo.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("typo/runs/run-000.log"))) << "no run started";
}

// Keys swept together (K1|K2=A1|A2,B1|B2): each value sets every key of
// its setting, the CSV has one column for them; a value with the wrong
// number of parts is one line before any run.
TEST(ExperimentTest, KeysSweptTogetherSetEveryKeyOfTheirSetting) {
  TempDir dir;
  auto r = troupe({"experiment", "--config", std::string(TROUPE_SOURCE_ROOT) + "/configs/mlp-fashion-mnist.toml",
                   "--set", "data.max_train_rows=2000", "--set", "run.threads=1", "--sweep",
                   "train.batch_size|train.max_steps=64|10,128|5", "--out", dir.file("exp")});
  ASSERT_EQ(r.exitCode, 0) << r.out << r.err;
  std::istringstream csv(readFile(dir.file("exp/experiment.csv")));
  std::string header, a, b;
  std::getline(csv, header);
  std::getline(csv, a);
  std::getline(csv, b);
  EXPECT_EQ(header.rfind("run,train.batch_size|train.max_steps,repeat,", 0), 0u) << header;
  EXPECT_EQ(a.rfind("0,64|10,0,1,ok,", 0), 0u) << a;
  EXPECT_EQ(b.rfind("1,128|5,0,1,ok,", 0), 0u) << b;
  EXPECT_EQ(field(readFile(dir.file("exp/runs/run-000/summary.json")), "steps"), 10);
  EXPECT_EQ(field(readFile(dir.file("exp/runs/run-000/summary.json")), "batch_size"), 64);
  EXPECT_EQ(field(readFile(dir.file("exp/runs/run-001/summary.json")), "steps"), 5);
  EXPECT_EQ(field(readFile(dir.file("exp/runs/run-001/summary.json")), "batch_size"), 128);
  auto bad = troupe({"experiment", "--config", std::string(TROUPE_SOURCE_ROOT) + "/configs/mlp-fashion-mnist.toml",
                     "--sweep", "train.batch_size|train.max_steps=64|10,128", "--out", dir.file("bad")});
  EXPECT_EQ(bad.exitCode, 2) << bad.err;
  EXPECT_NE(bad.err.find("the value '128' has 1 parts for the 2 keys swept together"), std::string::npos) << bad.err;
  auto twice = troupe({"experiment", "--config", std::string(TROUPE_SOURCE_ROOT) + "/configs/mlp-fashion-mnist.toml",
                       "--sweep", "train.batch_size|train.max_steps=64|10", "--sweep", "train.max_steps=5",
                       "--out", dir.file("twice")});
  EXPECT_EQ(twice.exitCode, 2) << twice.err;
  EXPECT_NE(twice.err.find("--sweep: train.max_steps is swept twice"), std::string::npos) << twice.err;
}

TEST(TrainTest, BadConfigurationsAreOneLineErrors) {
  TempDir dir;
  struct Case {
    std::vector<std::string> sets;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"model.kind=mlp"}, "data.kind 'criteo-synthetic' needs model.kind 'dlrm'"},
      {{"train.dense_optimizer=rmsprop"}, "train.dense_optimizer = 'rmsprop' is not an optimizer"},
      {{"model.bottom_mlp=[64, 8]"}, "the bottom MLP must end at the embedding dim 16"},
      {{"train.batch_size=0"}, "train.batch_size must be in [1, 16777216], got 0"},
      {{"data.kind=criteo"}, "data.kind 'criteo' needs data.train and data.test"},
      {{"data.kind=criteo", "data.train=/nonexistent/t.tsv", "data.test=/nonexistent/t.tsv"}, "/nonexistent/t.tsv"},
      {{"pipeline.stages=2", "model.kind=count"}, "pipeline.stages = 2, pipeline.replicas = 1 cuts the MLP or the "
                                                  "DLRM into stages; the count model is not cut"},
      {{"pipeline.replicas=0"}, "pipeline.replicas must be in [1, 64], got 0"},
      {{"pipeline.schedule=zb"}, "pipeline.schedule must be gpipe or 1f1b, got 'zb'"},
      {{"pipeline.stages=3", "pipeline.cut=2,1"}, "pipeline.cut must list increasing layer numbers"},
      {{"pipeline.stages=3", "pipeline.cut=2"}, "pipeline.cut '2' makes 2 stages; pipeline.stages is 3"},
      {{"pipeline.micro_batches=0"}, "pipeline.micro_batches must be in [1, 4096], got 0"},
      {{"ps.stale_lr=half"}, "ps.stale_lr must be none or inverse, got 'half'"},
      // Refused in one process too, where no shard or worker loss would have read them.
      {{"ps.consistency=bps"}, "ps.consistency must be one of bsp, ssp, asp, got 'bps'"},
      {{"supervision.on_worker_loss=retry"}, "supervision.on_worker_loss must be one of restart, shrink, fail, got 'retry'"},
      {{"ps.delay_compensation=-0.5"}, "ps.delay_compensation must be in [0, 1000000], got -0.5"},
      {{"ps.stale_lr=inverse", "ps.replicas=2"}, "ps.stale_lr = inverse with ps.replicas = 2: a backup serves no pulls"},
      {{"train.eval_every_steps=-1"}, "train.eval_every_steps must be in [0, 1000000000000], got -1"},
      {{"train.eval_every_seconds=-2"}, "train.eval_every_seconds must be in [0, 1000000000], got -2.0"},
      {{"train.dense_lr=nan"}, "train.dense_lr must be a finite number in (0, 100], got nan"},
      {{"train.dense_lr=-0.1"}, "train.dense_lr must be in (0, 100], got -0.1"},
      {{"train.embedding_lr=inf"}, "train.embedding_lr must be a finite number in (0, 100], got inf"},
      {{"model.kind=count", "train.eval_every_steps=10"},
       "train.eval_every_steps: the count model is checked against the counts once training is over"},
      {{"cluster.workers=2", "train.mode=allreduce", "pipeline.stages=2", "model.kind=mlp", "data.kind=fashion-mnist",
        "train.eval_every_seconds=5"},
       "train.eval_every_seconds: a pipeline across processes holds the model in pieces"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"train", "--config",
                                     std::string(TROUPE_SOURCE_ROOT) + "/configs/dlrm-synthetic.toml", "--set",
                                     "run.dir=" + dir.file("runs"), "--set", "data.cache_dir=" + dir.file("cache"),
                                     "--set", "data.synthetic.rows=1000"};
    for (const auto& s : c.sets) args.insert(args.end(), {"--set", s});
    auto r = troupe(args);
    EXPECT_EQ(r.exitCode, 2) << c.needle << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << "wanted '" << c.needle << "' in: " << r.err;
    EXPECT_NE(r.err.find("troupe: error: "), std::string::npos) << r.err;
  }
}

TEST(TrainTest, MalformedTrainingDataNamesFileAndLine) {
  TempDir dir;
  const std::string good = "1\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\ta\n";
  // Lines 2 (too few columns) and 4 (a letter in an integer column) are bad.
  writeFile(dir.file("train.tsv"), good + "0\t1\t2\n" + good + "1\tx\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\ta\n" + good);
  writeFile(dir.file("test.tsv"), good + good);
  const std::vector<std::string> job = {"train", "--set", "data.kind=criteo", "--set", "data.categorical=1", "--set",
                                        "data.train=" + dir.file("train.tsv"), "--set", "data.test=" + dir.file("test.tsv"),
                                        "--set", "run.dir=" + dir.file("runs")};
  auto r = troupe(job);
  EXPECT_EQ(r.exitCode, 1) << r.err;
  EXPECT_NE(r.err.find(dir.file("train.tsv") + ":2"), std::string::npos) << r.err;
  // data.on_bad_record = skip: the same file trains, and the summary counts
  // what was dropped, file by file.
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = job;
    args.insert(args.end(), more.begin(), more.end());
    return troupe(args);
  };
  r = with({"--set", "data.on_bad_record=skip", "--summary-json", dir.file("skip.json")});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(readFile(dir.file("skip.json"))).at("bad_records"),
            nlohmann::json({{"train", 2}, {"test", 0}}));
  // The older key still says skip (run directories written before keep loading).
  r = with({"--set", "data.skip_bad_lines=true", "--summary-json", dir.file("old.json")});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(readFile(dir.file("old.json"))).at("bad_records").at("train"), 2);
  r = with({"--set", "data.on_bad_record=ignore"});
  EXPECT_EQ(r.exitCode, 2) << r.err;
  EXPECT_NE(r.err.find("config: --set: data.on_bad_record must be one of fail, skip, got 'ignore'"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace troupe
