#include "common/config.h"

#include <gtest/gtest.h>

#include "common/check.h"
#include "tests/common/temp_dir.h"

namespace troupe {
namespace {

using testing::TempDir;
using testing::writeFile;

std::vector<Config::Key> schema() {
  using T = Config::Type;
  return {{"data.rows", T::kInt, int64_t{10}, "rows"},
          {"data.path", T::kString, std::string("a.tsv"), "path"},
          {"data.skip", T::kBool, false, "skip"},
          {"train.lr", T::kFloat, 0.1, "learning rate"},
          {"model.mlp", T::kIntList, std::vector<int64_t>{4, 2}, "widths"}};
}

// Runs fn and returns the SetupError message, or "" when nothing was thrown.
template <typename Fn>
std::string errorOf(Fn fn) {
  try {
    fn();
  } catch (const SetupError& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigTest, DefaultsFileThenOverrides) {
  TempDir dir;
  writeFile(dir.file("c.toml"), "[data]\nrows = 20\npath = \"b.tsv\"\n[train]\nlr = 1\n");
  Config c(schema());
  EXPECT_EQ(c.getInt("data.rows"), 10);
  EXPECT_FALSE(c.isSet("data.rows"));
  c.loadFile(dir.file("c.toml"));
  EXPECT_EQ(c.getInt("data.rows"), 20);
  EXPECT_TRUE(c.isSet("data.rows"));
  EXPECT_EQ(c.getString("data.path"), "b.tsv");
  EXPECT_DOUBLE_EQ(c.getFloat("train.lr"), 1.0);  // an integer is accepted as a float
  c.set("data.rows=30");
  c.set("data.skip=true");
  c.set("train.lr = 0.25");
  c.set("model.mlp=[8, 4,1]");
  c.set("data.path=\"q r.tsv\"");
  EXPECT_EQ(c.getInt("data.rows"), 30);
  EXPECT_TRUE(c.getBool("data.skip"));
  EXPECT_DOUBLE_EQ(c.getFloat("train.lr"), 0.25);
  EXPECT_EQ(c.getIntList("model.mlp"), (std::vector<int64_t>{8, 4, 1}));
  EXPECT_EQ(c.getString("data.path"), "q r.tsv");
}

TEST(ConfigTest, DottedKeysAndInlineTablesAreTheSame) {
  Config c(schema());
  c.loadString("data.rows = 7\nmodel = { mlp = [3] }\n", "inline");
  EXPECT_EQ(c.getInt("data.rows"), 7);
  EXPECT_EQ(c.getIntList("model.mlp"), (std::vector<int64_t>{3}));
}

TEST(ConfigTest, MissingFileNamesThePath) {
  Config c(schema());
  auto msg = errorOf([&] { c.loadFile("/nonexistent/dir/x.toml"); });
  EXPECT_NE(msg.find("/nonexistent/dir/x.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
}

TEST(ConfigTest, UnknownKeyNamesKeyFileAndLine) {
  Config c(schema());
  auto msg = errorOf([&] { c.loadString("[data]\nrows = 1\nrowz = 2\n", "my.toml"); });
  EXPECT_NE(msg.find("unknown key 'data.rowz'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("my.toml:3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("data.rows"), std::string::npos) << msg;  // the hint lists the table's keys
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}

TEST(ConfigTest, WrongTypeNamesKeyAndTypes) {
  Config c(schema());
  auto msg = errorOf([&] { c.loadString("[data]\nrows = \"many\"\n", "my.toml"); });
  EXPECT_NE(msg.find("'data.rows' must be an integer, got a string"), std::string::npos) << msg;
  msg = errorOf([&] { c.loadString("model.mlp = [1, \"x\"]\n", "my.toml"); });
  EXPECT_NE(msg.find("'model.mlp' must be a list of integers"), std::string::npos) << msg;
  msg = errorOf([&] { c.loadString("data.skip = 1\n", "my.toml"); });
  EXPECT_NE(msg.find("'data.skip' must be a boolean, got an integer"), std::string::npos) << msg;
  msg = errorOf([&] { c.loadString("[data.rows]\nx = 1\n", "my.toml"); });
  EXPECT_NE(msg.find("unknown key 'data.rows.x'"), std::string::npos) << msg;
}

TEST(ConfigTest, SyntaxErrorHasLineAndColumn) {
  Config c(schema());
  auto msg = errorOf([&] { c.loadString("[data]\nrows = = 3\n", "bad.toml"); });
  EXPECT_NE(msg.find("bad.toml:2:"), std::string::npos) << msg;
}

TEST(ConfigTest, BadOverrides) {
  Config c(schema());
  EXPECT_NE(errorOf([&] { c.set("data.rows"); }).find("expected key=value"), std::string::npos);
  EXPECT_NE(errorOf([&] { c.set("data.rows=12x"); }).find("'12x' is not a valid integer"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { c.set("train.lr=fast"); }).find("not a valid float"), std::string::npos);
  EXPECT_NE(errorOf([&] { c.set("data.skip=yes"); }).find("not a valid boolean"), std::string::npos);
  EXPECT_NE(errorOf([&] { c.set("nope.key=1"); }).find("unknown key 'nope.key' in --set"),
            std::string::npos);
  // A failed override leaves the old value.
  EXPECT_EQ(c.getInt("data.rows"), 10);
}

TEST(ConfigTest, TomlDumpRoundTrips) {
  Config a(schema());
  a.set("data.rows=99");
  a.set("data.path=x\"y");
  a.set("train.lr=0.5");
  Config b(schema());
  b.loadString(a.toToml(), "dump");
  EXPECT_EQ(b.getInt("data.rows"), 99);
  EXPECT_EQ(b.getString("data.path"), "x\"y");
  EXPECT_DOUBLE_EQ(b.getFloat("train.lr"), 0.5);
  EXPECT_EQ(b.toToml(), a.toToml());
}

TEST(ConfigTest, ProductSchemaIsConsistent) {
  Config c(troupeConfigSchema());  // aborts on a duplicate or mistyped default
  Config d(troupeConfigSchema());
  d.loadString(c.toToml(), "dump");
  EXPECT_EQ(d.toToml(), c.toToml());
  EXPECT_FALSE(c.describe().empty());
}

}  // namespace
}  // namespace troupe
