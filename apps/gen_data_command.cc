#include "apps/gen_data_command.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "apps/cli_common.h"
#include "common/check.h"
#include "common/compute_pool.h"
#include "common/hash.h"
#include "common/logging.h"
#include "data/synthetic_criteo.h"

namespace troupe::apps {
namespace {

namespace fs = std::filesystem;

// Flags of `gen-data criteo-synthetic`; negative / empty means "from the config".
struct GenDataFlags {
  CommonFlags common;
  int64_t rows = -1;
  int64_t testRows = -1;
  int64_t seed = -1;
  int64_t tables = -1;
  int64_t minVocab = -1;
  int64_t maxVocab = -1;
  std::string out;
  bool force = false;
};

data::SyntheticCriteoOptions optionsFrom(const Config& c) {
  data::SyntheticCriteoOptions o;
  o.rows = c.getInt("data.synthetic.rows");
  o.testRows = c.getInt("data.synthetic.test_rows");
  o.seed = uint64_t(c.getInt("data.synthetic.seed"));
  o.tables = int(c.getInt("data.synthetic.tables"));
  o.minVocab = c.getInt("data.synthetic.min_vocab");
  o.maxVocab = c.getInt("data.synthetic.max_vocab");
  o.zipf = c.getFloat("data.synthetic.zipf");
  o.factorDim = int(c.getInt("data.synthetic.factor_dim"));
  o.ctr = c.getFloat("data.synthetic.ctr");
  return o;
}

// Every option that changes the bytes, in one line; its hash names the cache
// directory and settings.txt records it beside the data.
std::string settingsLine(const data::SyntheticCriteoOptions& o) {
  return fmt::format(
      "criteo-synthetic v1 rows={} test_rows={} seed={} tables={} min_vocab={} max_vocab={} zipf={} "
      "factor_dim={} ctr={} weight_scale={} factor_scale={} dense_scale={} rare_rank={} rare_shrink={} "
      "block_rows={}",
      o.rows, data::syntheticTestRows(o), o.seed, o.tables, o.minVocab, o.maxVocab, o.zipf, o.factorDim, o.ctr,
      o.weightScale, o.factorScale, o.denseScale, o.rareRank, o.rareShrink, o.blockRows);
}

std::string readSmallFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return "";
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

// A number field of oracle.json ("auc": 0.8, ...); NaN when absent.
double jsonNumber(const std::string& json, const std::string& key) {
  auto pos = json.find("\"" + key + "\"");
  if (pos == std::string::npos) return std::nan("");
  pos = json.find(':', pos);
  if (pos == std::string::npos) return std::nan("");
  return std::strtod(json.c_str() + pos + 1, nullptr);
}

// Progress: a rewritten line on a terminal, a log line per 10% otherwise.
class ProgressReporter {
 public:
  ProgressReporter() : tty_(isatty(STDERR_FILENO) == 1), start_(std::chrono::steady_clock::now()) {}
  void operator()(int64_t done, int64_t total) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double rate = secs > 0 ? double(done) / secs : 0.0;
    const double eta = rate > 0 ? double(total - done) / rate : 0.0;
    const int pct = total > 0 ? int(100 * done / total) : 100;
    if (tty_) {
      std::fprintf(stderr, "\rgen-data: %3d%%  %lld / %lld rows  %.0f rows/s  ETA %.0f s   ", pct,
                   static_cast<long long>(done), static_cast<long long>(total), rate, eta);
      if (done >= total) std::fputc('\n', stderr);
    } else if (pct / 10 > lastDecile_ || done >= total) {
      lastDecile_ = pct / 10;
      logger("apps")->info("gen-data: {}% ({} / {} rows, {:.0f} rows/s, ETA {:.0f} s)", pct, done, total,
                           rate, eta);
    }
  }

 private:
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  int lastDecile_ = 0;
};

int runGenData(const GenDataFlags& flags) {
  Config config = loadConfig(flags.common);
  if (flags.rows >= 0) config.setValue("data.synthetic.rows", flags.rows);
  if (flags.testRows >= 0) config.setValue("data.synthetic.test_rows", flags.testRows);
  if (flags.seed >= 0) config.setValue("data.synthetic.seed", flags.seed);
  if (flags.tables >= 0) config.setValue("data.synthetic.tables", flags.tables);
  if (flags.minVocab >= 0) config.setValue("data.synthetic.min_vocab", flags.minVocab);
  if (flags.maxVocab >= 0) config.setValue("data.synthetic.max_vocab", flags.maxVocab);
  const data::SyntheticCriteoOptions options = optionsFrom(config);
  const std::string settings = settingsLine(options);

  fs::path dir = flags.out;
  if (dir.empty()) {
    dir = fs::path(config.getString("data.cache_dir")) /
          fmt::format("criteo-synthetic-{:016x}", hashBytes(settings));
  }
  auto log = logger("apps");
  const fs::path oraclePath = dir / data::kSyntheticOracleFile;
  const fs::path settingsPath = dir / "settings.txt";
  std::string oracleJson;
  double seconds = 0;
  if (!flags.force && fs::exists(oraclePath) && readSmallFile(settingsPath) == settings + "\n") {
    log->info("gen-data: {} already holds this data set (same settings); --force regenerates it",
              dir.string());
    oracleJson = readSmallFile(oraclePath);
  } else {
    // Describing builds the planted model, which validates the options first.
    const std::string description = data::describeSyntheticCriteo(options);
    log->info("gen-data: writing {} ({})", dir.string(), settings);
    log->debug("{}", description);
    ComputePool pool(resolveThreads(config));
    ProgressReporter progress;
    auto result = data::generateSyntheticCriteo(
        options, dir.string(), pool, [&](int64_t done, int64_t total) { progress(done, total); });
    if (!result.hasValue()) {
      std::fprintf(stderr, "troupe: error: gen-data: %s\n", result.status().toString().c_str());
      return kExitFailure;
    }
    seconds = result->seconds;
    std::ofstream(settingsPath, std::ios::trunc) << settings << "\n";
    oracleJson = readSmallFile(oraclePath);
  }
  const double trainRows = jsonNumber(oracleJson, "train_rows");
  const double testRows = jsonNumber(oracleJson, "test_rows");
  std::printf("criteo-synthetic: %.0f train + %.0f test rows, %d tables, in %s\n", trainRows, testRows,
              options.tables, dir.string().c_str());
  if (seconds > 0) {
    std::printf("generated in %.1f s (%.0f rows/s)\n", seconds, (trainRows + testRows) / seconds);
  }
  std::printf("oracle (the planted model on the test rows): AUC %.5f  log-loss %.5f  (CTR train %.4f, test %.4f)\n",
              jsonNumber(oracleJson, "auc"), jsonNumber(oracleJson, "logloss"),
              jsonNumber(oracleJson, "ctr_train"), jsonNumber(oracleJson, "ctr_test"));
  return kExitOk;
}

}  // namespace

void addGenDataCommand(CLI::App* app, int* result) {
  auto* cmd = app->add_subcommand("gen-data", "Generate a data set");
  cmd->require_subcommand(1);
  auto flags = std::make_shared<GenDataFlags>();
  auto* criteo = cmd->add_subcommand(
      "criteo-synthetic",
      "Criteo-format TSV from a planted model: DIR/train.tsv, DIR/test.tsv and DIR/oracle.json (the\n"
      "planted model's own test AUC and log-loss, the best any learner can reach). Same seed, same bytes.");
  addCommonFlags(criteo, &flags->common);
  criteo->add_option("--rows", flags->rows, "training rows (data.synthetic.rows)")->check(CLI::PositiveNumber);
  criteo->add_option("--test-rows", flags->testRows, "test rows; 0 = rows / 10 (data.synthetic.test_rows)")
      ->check(CLI::NonNegativeNumber);
  criteo->add_option("--out", flags->out,
                     "output directory; default <data.cache_dir>/criteo-synthetic-<hash of the settings>");
  criteo->add_option("--seed", flags->seed, "generator seed (data.synthetic.seed)")->check(CLI::NonNegativeNumber);
  criteo->add_option("--tables", flags->tables, "categorical tables (data.synthetic.tables)")
      ->check(CLI::Range(1, 1000));
  criteo->add_option("--min-vocab", flags->minVocab, "smallest vocabulary (data.synthetic.min_vocab)")
      ->check(CLI::PositiveNumber);
  criteo->add_option("--max-vocab", flags->maxVocab, "largest vocabulary (data.synthetic.max_vocab)")
      ->check(CLI::PositiveNumber);
  criteo->add_flag("--force", flags->force, "regenerate even when the directory already holds this data set");
  criteo->callback([=] { *result = runGuarded([&] { return runGenData(*flags); }); });
}

}  // namespace troupe::apps
