// The Debian package: CPack builds it from the build tree, it installs into
// a scratch root (dpkg -x), and the installed command runs from there: its
// version, and a small training run with the installed example config. Its
// Depends name the runtime libraries the binary links.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/common/subprocess.h"
#include "tests/common/temp_dir.h"

namespace troupe {
namespace {

using testing::readFile;
using testing::runProcess;
using testing::TempDir;
namespace fs = std::filesystem;

TEST(PackageTest, TheDebianPackageInstallsIntoAScratchRootAndRunsFromThere) {
  TempDir dir;
  auto pack = runProcess({"/usr/bin/env", "cpack", "-G", "DEB", "--config", std::string(TROUPE_BUILD_DIR) + "/CPackConfig.cmake",
                          "-B", dir.file("pkg")},
                         std::chrono::seconds(300), TROUPE_BUILD_DIR);
  ASSERT_EQ(pack.exitCode, 0) << pack.out << pack.err;
  std::string deb;
  for (const auto& e : fs::directory_iterator(dir.file("pkg"))) {
    if (e.path().extension() == ".deb") deb = e.path().string();
  }
  ASSERT_FALSE(deb.empty()) << pack.out;
  EXPECT_NE(deb.find("troupe_0.1.0_"), std::string::npos) << deb;
  // The runtime libraries, found by dpkg-shlibdeps from what the binary links.
  auto depends = runProcess({"/usr/bin/env", "dpkg-deb", "-f", deb, "Depends"});
  ASSERT_EQ(depends.exitCode, 0) << depends.err;
  for (const char* lib : {"libcaf-core0.17", "libucx0", "libcapnp", "libspdlog", "libopenblas"}) {
    EXPECT_NE(depends.out.find(lib), std::string::npos) << lib << " in: " << depends.out;
  }
  auto unpack = runProcess({"/usr/bin/env", "dpkg", "-x", deb, dir.file("root")});
  ASSERT_EQ(unpack.exitCode, 0) << unpack.err;
  const std::string troupe = dir.file("root/usr/bin/troupe");
  auto version = runProcess({troupe, "version"});
  ASSERT_EQ(version.exitCode, 0) << version.err;
  EXPECT_EQ(version.out.rfind("troupe 0.1.0\n", 0), 0u) << version.out;
  const std::string config = dir.file("root/usr/share/troupe/configs/dlrm-synthetic.toml");
  ASSERT_TRUE(fs::exists(config));
  EXPECT_TRUE(fs::exists(dir.file("root/usr/share/troupe/configs/mlp-fashion-mnist.toml")));
  EXPECT_TRUE(fs::exists(dir.file("root/usr/share/doc/troupe/README.md")));
  auto train = runProcess({troupe, "train", "--config", config, "--set", "data.synthetic.rows=4000", "--set",
                           "data.synthetic.test_rows=1000", "--set", "data.synthetic.tables=4", "--set",
                           "data.synthetic.max_vocab=500", "--set", "data.cache_dir=" + dir.file("cache"), "--set",
                           "run.dir=" + dir.file("runs"), "--set", "run.name=installed", "--set",
                           "cluster.workers=1", "--set", "cluster.servers=1"},
                          std::chrono::seconds(120));
  EXPECT_EQ(train.exitCode, 0) << train.out << train.err;
  // Its worker and ps processes are the installed binary too.
  EXPECT_NE(readFile(dir.file("runs/installed/worker-0.log")).find("exits (0)"), std::string::npos);
}

}  // namespace
}  // namespace troupe
