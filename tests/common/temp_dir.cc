#include "tests/common/temp_dir.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/check.h"

namespace troupe::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/troupe-test-XXXXXX";
  TROUPE_CHECK(mkdtemp(tmpl.data()) != nullptr, "mkdtemp({}) failed", tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
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
  TROUPE_CHECK(in.good(), "cannot read {}", path);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

}  // namespace troupe::testing
