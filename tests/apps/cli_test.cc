// End-to-end tests of the `troupe` binary: exit statuses, one-line errors for
// bad configuration, and gen-data as a user runs it.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

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
  for (const char* name : {"configs/dlrm-synthetic.toml"}) {
    auto r = troupe({"config", "show", "--config", std::string(TROUPE_SOURCE_ROOT) + "/" + name});
    EXPECT_EQ(r.exitCode, 0) << name << ": " << r.err;
  }
}

}  // namespace
}  // namespace troupe
