#include "common/config.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>
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

TEST(ConfigTest, NumbersOutsideTheirRangeAreRefusedAndLeaveTheOldValue) {
  using T = Config::Type;
  Config c({{"train.lr", T::kFloat, 0.1, "rate", Config::Range{0, 1, true, false}},
            {"train.any", T::kFloat, 0.0, "anything finite"},
            {"data.rows", T::kInt, int64_t{10}, "rows", Config::Range{1, 100, false, false}}});
  EXPECT_EQ(errorOf([&] { c.set("train.lr=nan"); }),
            "config: --set: train.lr must be a finite number in (0, 1], got nan");
  EXPECT_EQ(errorOf([&] { c.set("train.lr=inf"); }),
            "config: --set: train.lr must be a finite number in (0, 1], got inf");
  EXPECT_EQ(errorOf([&] { c.set("train.lr=-inf"); }),
            "config: --set: train.lr must be a finite number in (0, 1], got -inf");
  EXPECT_EQ(errorOf([&] { c.set("train.lr=0"); }), "config: --set: train.lr must be in (0, 1], got 0.0");
  EXPECT_EQ(errorOf([&] { c.set("train.lr=1.5"); }),
            "config: --set: train.lr must be in (0, 1], got 1.5");
  EXPECT_EQ(errorOf([&] { c.set("train.any=NaN"); }),
            "config: --set: train.any must be a finite number, got nan");
  EXPECT_EQ(errorOf([&] { c.set("data.rows=0"); }), "config: --set: data.rows must be in [1, 100], got 0");
  EXPECT_EQ(errorOf([&] { c.set("data.rows=101"); }),
            "config: --set: data.rows must be in [1, 100], got 101");
  EXPECT_EQ(errorOf([&] { c.setValue("train.lr", -1.0); }),
            "config: a command-line flag: train.lr must be in (0, 1], got -1.0");
  // Nothing refused was kept.
  EXPECT_DOUBLE_EQ(c.getFloat("train.lr"), 0.1);
  EXPECT_EQ(c.getInt("data.rows"), 10);
  // The closed ends are in.
  c.set("train.lr=1");
  c.set("data.rows=1");
  EXPECT_DOUBLE_EQ(c.getFloat("train.lr"), 1.0);
  c.set("data.rows=100");
  EXPECT_EQ(c.getInt("data.rows"), 100);
  // In a file: the file and line are named.
  TempDir dir;
  writeFile(dir.file("a.toml"), "[data]\nrows = 5\n[train]\nlr = nan\n");
  EXPECT_EQ(errorOf([&] { c.loadFile(dir.file("a.toml")); }),
            "config: " + dir.file("a.toml") + ":4: train.lr must be a finite number in (0, 1], got nan");
  writeFile(dir.file("b.toml"), "[data]\nrows = 0\n");
  EXPECT_EQ(errorOf([&] { c.loadFile(dir.file("b.toml")); }),
            "config: " + dir.file("b.toml") + ":2: data.rows must be in [1, 100], got 0");
  // An integer in a file for a float key is checked too, and refused keeps the old value.
  writeFile(dir.file("c.toml"), "[train]\nlr = 5\n");
  EXPECT_EQ(errorOf([&] { c.loadFile(dir.file("c.toml")); }),
            "config: " + dir.file("c.toml") + ":2: train.lr must be in (0, 1], got 5.0");
  EXPECT_DOUBLE_EQ(c.getFloat("train.lr"), 1.0);
  // A range shows in the key's description.
  EXPECT_NE(c.describe().find("rate (finite, (0, 1])"), std::string::npos) << c.describe();
  EXPECT_NE(c.describe().find("rows ([1, 100])"), std::string::npos) << c.describe();
}

TEST(ConfigTest, RangesSayAndHoldTheirEnds) {
  using R = Config::Range;
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ((R{0, 1, true, true}).toString(), "(0, 1)");
  EXPECT_EQ((R{0, 1, false, true}).toString(), "[0, 1)");
  EXPECT_EQ((R{0, 1e6, false, false}).toString(), "[0, 1000000]");
  EXPECT_EQ((R{0.5, 2.25, true, false}).toString(), "(0.5, 2.25]");
  EXPECT_EQ((R{0, inf, false, false}).toString(), ">= 0");
  EXPECT_EQ((R{0, inf, true, false}).toString(), "> 0");
  EXPECT_EQ((R{-inf, 5, false, false}).toString(), "<= 5");
  EXPECT_EQ((R{}).toString(), "any value");
  EXPECT_FALSE((R{0, 1, true, false}).contains(0));
  EXPECT_TRUE((R{0, 1, true, false}).contains(1));
  EXPECT_TRUE((R{0, 1, false, true}).contains(0));
  EXPECT_FALSE((R{0, 1, false, true}).contains(1));
  EXPECT_FALSE((R{}).contains(std::nan("")));
  EXPECT_TRUE((R{}).contains(inf));  // the finite check is the float key's, not the range's
  EXPECT_TRUE((R{}).any());
  EXPECT_FALSE((R{0, inf, false, false}).any());
}

// Every float key of troupe's schema has a finite range; NaN, both
// infinities and a value just past each end are refused with one line that
// names the key, the value and the range, and the ends that are in pass.
TEST(ConfigTest, EveryFloatKeyRefusesNaNInfinityAndBothSidesOfItsRange) {
  int floats = 0;
  for (const Config::Key& k : troupeConfigSchema()) {
    if (k.type != Config::Type::kFloat) continue;
    ++floats;
    const Config::Range& r = k.range;
    ASSERT_TRUE(std::isfinite(r.lo) && std::isfinite(r.hi)) << k.name << " has no finite range";
    Config c(troupeConfigSchema());
    auto refused = [&](const std::string& text, const std::string& what) {
      const std::string e = errorOf([&] { c.set(k.name + "=" + text); });
      EXPECT_EQ(e.rfind("config: --set: " + k.name + " must be " + what, 0), 0u)
          << k.name << "=" << text << ": " << e;
      EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    };
    const std::string range = r.toString();
    for (const char* text : {"nan", "inf", "-inf"}) refused(text, "a finite number in " + range + ", got ");
    const double below = r.loOpen ? r.lo : r.lo - std::max(1.0, std::fabs(r.lo));
    const double above = r.hiOpen ? r.hi : r.hi + std::max(1.0, std::fabs(r.hi));
    refused(fmt::format("{}", below), "in " + range + ", got ");
    refused(fmt::format("{}", above), "in " + range + ", got ");
    if (!r.loOpen) c.set(k.name + "=" + fmt::format("{}", r.lo));
    if (!r.hiOpen) c.set(k.name + "=" + fmt::format("{}", r.hi));
    EXPECT_TRUE(r.contains(std::get<double>(k.defaultValue))) << k.name;
  }
  EXPECT_EQ(floats, 16);
}

TEST(ConfigTest, EveryIntegerKeyRefusesNaNInfinityAndBothSidesOfItsRange) {
  int ints = 0, lists = 0;
  for (const Config::Key& k : troupeConfigSchema()) {
    if (k.type != Config::Type::kInt && k.type != Config::Type::kIntList) continue;
    const bool list = k.type == Config::Type::kIntList;
    ++(list ? lists : ints);
    const Config::Range& r = k.range;
    ASSERT_TRUE(std::isfinite(r.lo) && std::isfinite(r.hi)) << k.name << " has no finite range";
    ASSERT_FALSE(r.loOpen || r.hiOpen) << k.name;  // integer ranges name their ends
    Config c(troupeConfigSchema());
    auto text = [&](const std::string& v) { return k.name + "=" + (list ? "[" + v + "]" : v); };
    for (const char* v : {"nan", "inf", "-inf", "1.5"}) {
      const std::string e = errorOf([&] { c.set(text(v)); });
      const std::string why = list ? fmt::format("'[{}]' is not a valid list of integers", v)
                                   : fmt::format("'{}' is not a valid integer", v);
      EXPECT_NE(e.find(why), std::string::npos) << text(v) << ": " << e;
    }
    const auto below = int64_t(r.lo) - 1, above = int64_t(r.hi) + 1;
    const std::string want = fmt::format("config: --set: {}{} must be in {}, got ", list ? "every item of " : "",
                                         k.name, r.toString());
    for (int64_t v : {below, above}) {
      const std::string e = errorOf([&] { c.set(text(std::to_string(v))); });
      EXPECT_EQ(e.rfind(want, 0), 0u) << text(std::to_string(v)) << ": " << e;
      EXPECT_NE(e.find(std::to_string(v)), std::string::npos) << e;
    }
    // Both ends are taken, and the default lies between them.
    c.set(text(std::to_string(int64_t(r.lo))));
    c.set(text(std::to_string(int64_t(r.hi))));
    if (list) {
      for (int64_t v : std::get<std::vector<int64_t>>(k.defaultValue)) EXPECT_TRUE(r.contains(double(v))) << k.name;
    } else {
      EXPECT_TRUE(r.contains(double(std::get<int64_t>(k.defaultValue)))) << k.name;
    }
  }
  EXPECT_EQ(ints, 58);
  EXPECT_EQ(lists, 3);
}

// Found by config_fuzz: a string that is not UTF-8 could be set, and then
// the run's config.toml (what --resume reads) could not be read back.
TEST(ConfigTest, StringsMustBeUtf8SoThatTheirDumpLoadsAgain) {
  Config c(schema());
  EXPECT_EQ(errorOf([&] { c.set("data.path=a\xa4" "b"); }),
            "config: --set: data.path must be UTF-8 text; its value is not");
  EXPECT_EQ(errorOf([&] { c.set("data.path=\xc0\xaf"); }),  // an overlong '/'
            "config: --set: data.path must be UTF-8 text; its value is not");
  EXPECT_EQ(errorOf([&] { c.set("data.path=\xed\xa0\x80"); }),  // a surrogate
            "config: --set: data.path must be UTF-8 text; its value is not");
  EXPECT_EQ(errorOf([&] { c.set("data.path=\xe2\x9c"); }),  // truncated
            "config: --set: data.path must be UTF-8 text; its value is not");
  EXPECT_EQ(errorOf([&] { c.setValue("data.path", std::string("\xff")); }),
            "config: a command-line flag: data.path must be UTF-8 text; its value is not");
  EXPECT_EQ(c.getString("data.path"), "a.tsv");  // unchanged
  c.set("data.path=caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80 \"q\" \\" "b\tc");  // UTF-8, quotes, a tab
  Config d(schema());
  d.loadString(c.toToml(), "dump");
  EXPECT_EQ(d.getString("data.path"), c.getString("data.path"));
  EXPECT_EQ(d.toToml(), c.toToml());
}

TEST(ConfigTest, AStringKeyWithChoicesTakesOnlyThose) {
  using T = Config::Type;
  auto keys = schema();
  keys.push_back({"net.guard", T::kString, std::string("crc"), "guard", {}, {"off", "crc", "mac"}});
  Config c(keys);
  EXPECT_EQ(errorOf([&] { c.set("net.guard=sha1"); }), "config: --set: net.guard must be one of off, crc, mac, got 'sha1'");
  EXPECT_EQ(errorOf([&] { c.set("net.guard="); }), "config: --set: net.guard must be one of off, crc, mac, got ''");
  EXPECT_EQ(errorOf([&] { c.setValue("net.guard", std::string("CRC")); }),
            "config: a command-line flag: net.guard must be one of off, crc, mac, got 'CRC'");
  EXPECT_EQ(errorOf([&] { c.loadString("[net]\nguard = \"none\"\n", "a.toml"); }),
            "config: a.toml:2: net.guard must be one of off, crc, mac, got 'none'");
  EXPECT_EQ(c.getString("net.guard"), "crc");  // unchanged
  c.set("net.guard=mac");
  EXPECT_EQ(c.getString("net.guard"), "mac");
  c.set("net.guard=\"off\"");
  EXPECT_EQ(c.getString("net.guard"), "off");
  EXPECT_NE(c.describe().find("guard (one of off, crc, mac)"), std::string::npos) << c.describe();
  // A string key without choices takes any text.
  c.set("data.path=sha1");
  EXPECT_EQ(c.getString("data.path"), "sha1");
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
