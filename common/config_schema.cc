// Every configuration key troupe understands, with its default and meaning.
// A key not listed here is refused by name when it appears in a file or --set.
#include "common/config.h"

namespace troupe {

std::vector<Config::Key> troupeConfigSchema() {
  using T = Config::Type;
  return {
      // ---- run ----
      {"run.threads", T::kInt, int64_t{0}, "compute threads (OpenBLAS and kernels); 0 = all cores"},
      {"run.seed", T::kInt, int64_t{1}, "seed for initialisation and shuffling"},
      {"log.level", T::kString, std::string("info"), "trace, debug, info, warn, error, critical, off"},
      // ---- data ----
      {"data.kind", T::kString, std::string("criteo-synthetic"),
       "criteo-synthetic, criteo, libsvm or fashion-mnist"},
      {"data.train", T::kString, std::string(""), "training file (criteo, libsvm) or directory (fashion-mnist)"},
      {"data.test", T::kString, std::string(""), "test file (criteo, libsvm)"},
      {"data.cache_dir", T::kString, std::string("cache/data"),
       "where generated data sets are kept (criteo-synthetic)"},
      {"data.skip_bad_lines", T::kBool, false, "count and skip malformed lines instead of failing"},
      {"data.categorical", T::kInt, int64_t{26}, "categorical columns per Criteo line"},
      // ---- synthetic Criteo generator ----
      {"data.synthetic.rows", T::kInt, int64_t{2'000'000}, "training rows"},
      {"data.synthetic.test_rows", T::kInt, int64_t{0}, "test rows; 0 = rows / 10"},
      {"data.synthetic.seed", T::kInt, int64_t{1}, "generator seed (same seed, same bytes)"},
      {"data.synthetic.tables", T::kInt, int64_t{26}, "categorical tables (columns)"},
      {"data.synthetic.min_vocab", T::kInt, int64_t{10}, "vocabulary of the smallest table"},
      {"data.synthetic.max_vocab", T::kInt, int64_t{1'000'000}, "vocabulary of the largest table"},
      {"data.synthetic.zipf", T::kFloat, 1.1, "Zipf exponent of categorical values"},
      {"data.synthetic.factor_dim", T::kInt, int64_t{4}, "dimension of the planted pairwise factors"},
      {"data.synthetic.ctr", T::kFloat, 0.25, "target click-through rate"},
  };
}

}  // namespace troupe
