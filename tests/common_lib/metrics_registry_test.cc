// The Prometheus text exposition of the registry: HELP and TYPE lines, label
// sets in order, escaped label values and help, counters that add up, and
// names the format does not allow refused. The exact text is written out
// here by hand; Debian's promtool then checks it (and refuses a broken one),
// so a test fails on a malformed exposition even where the hand-written
// expectation would agree with a wrong renderer.
#include "common/metrics_registry.h"

#include <cstdio>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "tests/common/subprocess.h"
#include "tests/common/temp_dir.h"

namespace troupe {
namespace {

using testing::runProcess;
using testing::TempDir;
using testing::writeFile;

// A registry written to in a known order (what render must sort).
void fill(MetricsRegistry& m) {
  m.declare("troupe_worker_step", MetricsRegistry::Type::kGauge, "steps the worker has taken");
  m.declare("troupe_progress_reports_total", MetricsRegistry::Type::kCounter, "progress reports\nreceived \\ so far");
  m.set("troupe_worker_step", {{"worker", "1"}}, 20);
  m.set("troupe_worker_step", {{"worker", "0"}}, 40);
  m.add("troupe_progress_reports_total", 2);
  m.add("troupe_progress_reports_total", 3);
  m.set("troupe_job_label", {{"name", "a \"b\"\\c\nd"}}, 0.25);
}

std::string sample() {
  MetricsRegistry m;
  fill(m);
  return m.render();
}

TEST(MetricsRegistry, RendersTheTextExposition) {
  EXPECT_EQ(sample(),
            "# HELP troupe_job_label troupe_job_label\n"
            "# TYPE troupe_job_label gauge\n"
            "troupe_job_label{name=\"a \\\"b\\\"\\\\c\\nd\"} 0.25\n"
            "# HELP troupe_progress_reports_total progress reports\\nreceived \\\\ so far\n"
            "# TYPE troupe_progress_reports_total counter\n"
            "troupe_progress_reports_total 5\n"
            "# HELP troupe_worker_step steps the worker has taken\n"
            "# TYPE troupe_worker_step gauge\n"
            "troupe_worker_step{worker=\"0\"} 40\n"
            "troupe_worker_step{worker=\"1\"} 20\n");
  MetricsRegistry m;
  EXPECT_THROW(m.set("2bad", 1), std::invalid_argument);
  EXPECT_THROW(m.set("bad-name", 1), std::invalid_argument);
  EXPECT_THROW(m.set("ok", {{"__reserved", "x"}}, 1), std::invalid_argument);
  EXPECT_THROW(m.set("ok", {{"a:b", "x"}}, 1), std::invalid_argument);
  EXPECT_EQ(m.render(), "");  // nothing set, nothing said
}

TEST(MetricsRegistry, PromtoolAcceptsTheExpositionAndRefusesABrokenOne) {
  ASSERT_EQ(runProcess({"/bin/sh", "-c", "command -v promtool"}).exitCode, 0)
      << "promtool not found: scripts/setup.sh installs Debian's prometheus";
  TempDir dir;
  writeFile(dir.file("good.txt"), sample());
  auto good = runProcess({"/bin/sh", "-c", "promtool check metrics < " + dir.file("good.txt")});
  EXPECT_EQ(good.exitCode, 0) << good.out << good.err;
  // A value that is not a number, and a counter without _total: refused.
  writeFile(dir.file("bad.txt"), "# HELP x a\n# TYPE x gauge\nx{worker=\"0\"} forty\n");
  auto bad = runProcess({"/bin/sh", "-c", "promtool check metrics < " + dir.file("bad.txt")});
  EXPECT_NE(bad.exitCode, 0) << bad.out << bad.err;
  writeFile(dir.file("lint.txt"), "# HELP troupe_reports reports\n# TYPE troupe_reports counter\ntroupe_reports 1\n");
  auto lint = runProcess({"/bin/sh", "-c", "promtool check metrics < " + dir.file("lint.txt")});
  EXPECT_NE(lint.exitCode, 0) << lint.out << lint.err;
}

}  // namespace
}  // namespace troupe
