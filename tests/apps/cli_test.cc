// End-to-end tests of the `troupe` binary: exit statuses, one-line errors for
// bad configuration, and gen-data as a user runs it.
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/config.h"
#include "tests/common/subprocess.h"
#include "tests/common/temp_dir.h"

namespace troupe {
namespace {

using testing::ProcessResult;
using testing::readFile;
using testing::runProcess;
using testing::TempDir;
using testing::writeFile;

ProcessResult troupe(std::vector<std::string> args, const std::string& cwd = "") {
  args.insert(args.begin(), TROUPE_BINARY);
  return runProcess(args, std::chrono::seconds(120), cwd);
}

size_t countLines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// A set-up error is exactly one line on stderr, exit status 2, nothing on stdout.
void expectUsageError(const ProcessResult& r, const std::string& needle) {
  EXPECT_EQ(r.exitCode, 2) << r.err;
  EXPECT_EQ(countLines(r.err), 1u) << r.err;
  EXPECT_EQ(r.err.rfind("troupe: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(CliTest, HelpListsCommands) {
  auto r = troupe({"--help"});
  EXPECT_EQ(r.exitCode, 0);
  for (const char* cmd : {"gen-data", "config", "version"}) {
    EXPECT_NE(r.out.find(cmd), std::string::npos) << cmd << " missing from:\n" << r.out;
  }
  r = troupe({"gen-data", "criteo-synthetic", "--help"});
  EXPECT_EQ(r.exitCode, 0);
  EXPECT_NE(r.out.find("--rows"), std::string::npos) << r.out;
}

TEST(CliTest, UnknownCommandIsAUsageError) {
  auto r = troupe({"frobnicate"});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_NE(r.err.find("frobnicate"), std::string::npos) << r.err;
  r = troupe({});
  EXPECT_EQ(r.exitCode, 2);
}

TEST(CliTest, VersionNamesTheRealLibraries) {
  auto r = troupe({"version"});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  EXPECT_NE(r.out.find("CAF          0.17"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("UCX          1."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Cap'n Proto  0.9"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("OpenBLAS"), std::string::npos) << r.out;
}

TEST(CliTest, MissingConfigFile) {
  expectUsageError(troupe({"config", "show", "--config", "/nonexistent/troupe.toml"}),
                   "cannot open '/nonexistent/troupe.toml': No such file or directory");
}

TEST(CliTest, UnknownKeyInFile) {
  TempDir dir;
  writeFile(dir.file("c.toml"), "[data.synthetic]\nrows = 5\nrowz = 6\n");
  expectUsageError(troupe({"config", "show", "--config", dir.file("c.toml")}),
                   "unknown key 'data.synthetic.rowz' in " + dir.file("c.toml") + ":3");
}

TEST(CliTest, WrongTypeInFile) {
  TempDir dir;
  writeFile(dir.file("c.toml"), "[data.synthetic]\nzipf = \"steep\"\n");
  expectUsageError(troupe({"config", "show", "--config", dir.file("c.toml")}),
                   "'data.synthetic.zipf' must be a float, got a string");
}

TEST(CliTest, BadOverrideAndBadLogLevel) {
  expectUsageError(troupe({"config", "show", "--set", "data.synthetic.rows=lots"}),
                   "--set data.synthetic.rows: 'lots' is not a valid integer");
  expectUsageError(troupe({"config", "show", "--set", "data.synthetik.rows=1"}),
                   "unknown key 'data.synthetik.rows'");
  expectUsageError(troupe({"config", "show", "--log-level", "loud"}), "unknown log level 'loud'");
}

TEST(CliTest, ConfigShowAppliesFileThenOverrides) {
  TempDir dir;
  writeFile(dir.file("c.toml"), "[data.synthetic]\nrows = 5\nseed = 9\n");
  auto r = troupe({"config", "show", "--config", dir.file("c.toml"), "--set", "data.synthetic.seed=11"});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  EXPECT_NE(r.out.find("rows = 5\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("seed = 11\n"), std::string::npos) << r.out;
}

TEST(CliTest, ShippedConfigsLoad) {
  for (const char* name : {"configs/dlrm-synthetic.toml", "configs/mlp-fashion-mnist.toml"}) {
    auto r = troupe({"config", "show", "--config", std::string(TROUPE_SOURCE_ROOT) + "/" + name});
    EXPECT_EQ(r.exitCode, 0) << name << ": " << r.err;
  }
}

TEST(CliTest, GenDataIsDeterministicAndReusesTheCache) {
  TempDir dir;
  const std::vector<std::string> common = {"gen-data", "criteo-synthetic", "--rows", "3000", "--test-rows", "700",
                                           "--tables", "5", "--max-vocab", "300", "--seed", "4"};
  auto withArgs = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = common;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto one = troupe(withArgs({"--out", dir.file("a"), "--threads", "1"}));
  ASSERT_EQ(one.exitCode, 0) << one.err;
  auto two = troupe(withArgs({"--out", dir.file("b"), "--threads", "2"}));
  ASSERT_EQ(two.exitCode, 0) << two.err;
  for (const char* f : {"train.tsv", "test.tsv", "oracle.json"}) {
    EXPECT_EQ(readFile(dir.file("a/") + f), readFile(dir.file("b/") + f)) << f;
  }
  EXPECT_EQ(countLines(readFile(dir.file("a/train.tsv"))), 3000u);
  EXPECT_EQ(countLines(readFile(dir.file("a/test.tsv"))), 700u);
  EXPECT_NE(one.out.find("3000 train + 700 test rows"), std::string::npos) << one.out;
  EXPECT_NE(one.out.find("oracle (the planted model on the test rows): AUC 0."), std::string::npos) << one.out;

  // Same settings again: reused, same metrics printed, files untouched.
  const auto before = std::filesystem::last_write_time(dir.file("a/train.tsv"));
  auto again = troupe(withArgs({"--out", dir.file("a")}));
  ASSERT_EQ(again.exitCode, 0) << again.err;
  EXPECT_NE(again.err.find("already holds this data set"), std::string::npos) << again.err;
  EXPECT_EQ(std::filesystem::last_write_time(dir.file("a/train.tsv")), before);
  auto metrics = [](const std::string& out) { return out.substr(out.find("oracle")); };
  EXPECT_EQ(metrics(again.out), metrics(one.out));

  // Another seed: other data.
  auto other = troupe({"gen-data", "criteo-synthetic", "--rows", "3000", "--test-rows", "700", "--tables", "5",
                       "--max-vocab", "300", "--seed", "5", "--out", dir.file("c")});
  ASSERT_EQ(other.exitCode, 0) << other.err;
  EXPECT_NE(readFile(dir.file("c/train.tsv")), readFile(dir.file("a/train.tsv")));
}

TEST(CliTest, GenDataFromTheConfigGoesToTheCache) {
  TempDir dir;
  auto r = troupe({"gen-data", "criteo-synthetic", "--config",
                   std::string(TROUPE_SOURCE_ROOT) + "/configs/dlrm-synthetic.toml", "--set",
                   "data.synthetic.rows=2000", "--set", "data.synthetic.test_rows=500", "--set",
                   "data.cache_dir=" + dir.path()});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  int datasets = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename().string().rfind("criteo-synthetic-", 0), 0u) << entry.path();
    EXPECT_TRUE(std::filesystem::exists(entry.path() / "oracle.json"));
    ++datasets;
  }
  EXPECT_EQ(datasets, 1);
}

TEST(CliTest, GenDataRejectsBadSettings) {
  TempDir dir;
  auto r = troupe({"gen-data", "criteo-synthetic", "--rows", "0", "--out", dir.file("x")});
  EXPECT_EQ(r.exitCode, 2) << r.err;
  EXPECT_NE(r.err.find("--rows"), std::string::npos) << r.err;
  expectUsageError(troupe({"gen-data", "criteo-synthetic", "--rows", "100", "--set", "data.synthetic.zipf=0",
                           "--out", dir.file("y")}),
                   "zipf");
  expectUsageError(troupe({"gen-data", "criteo-synthetic", "--rows", "100", "--min-vocab", "50", "--max-vocab",
                           "10", "--out", dir.file("z")}),
                   "vocab");
  EXPECT_FALSE(std::filesystem::exists(dir.file("z/oracle.json")));
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// `troupe bench transport` runs two real processes; here only its output and
// errors are checked (its speed lives in bench/RESULTS.md).
TEST(CliTest, BenchTransportWritesItsJson) {
  TempDir dir;
  const std::string json = dir.file("transport.json");
  auto r = troupe({"bench", "transport", "--seconds", "0.05", "--trials", "1", "--round-trips", "50",
                   "--no-perftest", "--json", json});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  const std::string text = readFile(json);
  for (const char* key : {"\"rows\"", "\"bytes\": 4096", "\"bytes\": 16777216", "\"troupe_mbps\"",
                          "\"ucx_perftest_mbps\"", "\"troupe_roundtrip_us\"", "\"ucx_perftest_roundtrip_us\""}) {
    EXPECT_NE(text.find(key), std::string::npos) << key << " missing from " << text;
  }
  EXPECT_NE(r.out.find("round trip of a small request"), std::string::npos) << r.out;
}

TEST(CliTest, BenchTransportRefusesBadSettingsAtOnce) {
  expectUsageError(troupe({"bench", "transport", "--set", "transport.listen_host=0.0.0.0"}), "transport.listen_host");
  expectUsageError(troupe({"bench", "transport", "--set", "transport.heartbeat_timeout_ms=100"}),
                   "heartbeat_timeout_ms");
  expectUsageError(troupe({"bench", "transport", "--json", "/nonexistent-dir/x.json"}), "/nonexistent-dir/x.json");
}

// Every numeric key of the product's schema, through the binary: NaN, both
// infinities and one value past each end of its range are a one-line error
// naming the key, the value and the range, with exit status 2.
TEST(CliTest, EveryNumericKeyRefusesNaNInfinityAndBothSidesOfItsRange) {
  int keys = 0;
  for (const Config::Key& k : troupeConfigSchema()) {
    const bool isFloat = k.type == Config::Type::kFloat, isList = k.type == Config::Type::kIntList;
    if (!isFloat && !isList && k.type != Config::Type::kInt) continue;
    ++keys;
    const Config::Range& r = k.range;
    ASSERT_TRUE(std::isfinite(r.lo) && std::isfinite(r.hi)) << k.name;
    auto set = [&](const std::string& v) {
      return troupe({"config", "show", "--set", k.name + "=" + (isList ? "[" + v + "]" : v)});
    };
    for (const std::string v : {"nan", "inf", "-inf"}) {
      expectUsageError(set(v), isFloat  ? k.name + " must be a finite number in " + r.toString() + ", got " + v
                               : isList ? "'[" + v + "]' is not a valid list of integers"
                                        : "'" + v + "' is not a valid integer");
    }
    std::string below, above;
    if (isFloat) {
      below = fmt::format("{}", r.loOpen ? r.lo : r.lo - std::max(1.0, std::fabs(r.lo)));
      above = fmt::format("{}", r.hiOpen ? r.hi : r.hi + std::max(1.0, std::fabs(r.hi)));
    } else {
      below = std::to_string(int64_t(r.lo) - 1);
      above = std::to_string(int64_t(r.hi) + 1);
    }
    for (const std::string& v : {below, above}) {
      expectUsageError(set(v), (isList ? "every item of " : "") + k.name + " must be in " + r.toString() + ", got ");
    }
  }
  EXPECT_EQ(keys, 16 + 58 + 3);
}

}  // namespace
}  // namespace troupe
