#include "tests/common/temp_dir.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "common/check.h"

namespace troupe::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/troupe-test-XXXXXX";
  TROUPE_CHECK(mkdtemp(tmpl.data()) != nullptr, "mkdtemp({}) failed", tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  // A failed test keeps its logs and summaries (not its data) for a look
  // afterwards: a failure seen once under load is not lost with the directory.
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  if (test && test->result() && test->result()->Failed()) {
    const std::string kept = path_ + "-kept";
    size_t files = 0;
    for (auto it = fs::recursive_directory_iterator(path_, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      const auto ext = it->path().extension();
      if (!it->is_regular_file(ec) || (ext != ".log" && ext != ".json" && ext != ".toml")) continue;
      const fs::path to = fs::path(kept) / fs::relative(it->path(), path_, ec);
      fs::create_directories(to.parent_path(), ec);
      fs::copy_file(it->path(), to, fs::copy_options::overwrite_existing, ec);
      ++files;
    }
    if (files > 0) std::fprintf(stderr, "kept %zu logs and summaries of the failed test in %s\n", files, kept.c_str());
  }
  std::filesystem::remove_all(path_, ec);
}

void writeFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TROUPE_CHECK(out.good(), "cannot write {}", path);
  out << contents;
  TROUPE_CHECK(out.good(), "cannot write {}", path);
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) {
    // A test failure, not an abort: the binary's other tests still run (a
    // job that failed to write its summary is already a failure of its own).
    ADD_FAILURE() << "cannot read " << path;
    return "";
  }
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

std::vector<std::vector<std::string>> readMetricsCsv(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  std::stringstream in(readFile(path));
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "epoch,step,elapsed_s,rows,loss,auc,accuracy,samples,wall_s") << path;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    EXPECT_EQ(f.size(), 9u) << path << ": " << line;
    if (f.size() == 9) rows.push_back(std::move(f));
  }
  return rows;
}

}  // namespace troupe::testing
