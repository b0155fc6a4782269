#include "apps/gen_data_command.h"

#include <cstdio>
#include <memory>

#include "apps/cli_common.h"
#include "data/synthetic_cache.h"

namespace troupe::apps {
namespace {

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

int runGenData(const GenDataFlags& flags) {
  Config config = loadConfig(flags.common);
  if (flags.rows >= 0) config.setValue("data.synthetic.rows", flags.rows);
  if (flags.testRows >= 0) config.setValue("data.synthetic.test_rows", flags.testRows);
  if (flags.seed >= 0) config.setValue("data.synthetic.seed", flags.seed);
  if (flags.tables >= 0) config.setValue("data.synthetic.tables", flags.tables);
  if (flags.minVocab >= 0) config.setValue("data.synthetic.min_vocab", flags.minVocab);
  if (flags.maxVocab >= 0) config.setValue("data.synthetic.max_vocab", flags.maxVocab);
  auto set = data::ensureSyntheticData(config, flags.out, flags.force, resolveThreads(config));
  if (!set.hasValue()) {
    std::fprintf(stderr, "troupe: error: gen-data: %s\n", set.status().toString().c_str());
    return kExitFailure;
  }
  std::printf("criteo-synthetic: %lld train + %lld test rows, %lld tables, in %s\n",
              static_cast<long long>(set->oracle.trainRows), static_cast<long long>(set->oracle.testRows),
              static_cast<long long>(config.getInt("data.synthetic.tables")), set->dir.c_str());
  const auto& o = set->oracle;
  if (set->generated && o.seconds > 0) {
    std::printf("generated in %.1f s (%.0f rows/s)\n", o.seconds, double(o.trainRows + o.testRows) / o.seconds);
  }
  std::printf("oracle (the planted model on the test rows): AUC %.5f  log-loss %.5f  (CTR train %.4f, test %.4f)\n",
              o.auc, o.logloss, o.ctrTrain, o.ctrTest);
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
