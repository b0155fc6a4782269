// OpenBLAS's kernels as wide as the CPU's vectors (kernels/cpu/blas_core.h):
// the choice from names and vectors, and a process that OpenBLAS gave a
// fallback core (pretended: this machine's OpenBLAS detects it right)
// starting again on the right one, with the real library.
#include "kernels/cpu/blas_core.h"

#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/common/subprocess.h"

namespace troupe::kernels {
namespace {

TEST(BlasCore, LevelsAreTheVectorWidthOfEachCoresKernels) {
  EXPECT_EQ(blasCoreLevel("Prescott"), 0);
  EXPECT_EQ(blasCoreLevel("prescott"), 0);  // OPENBLAS_CORETYPE is case-insensitive
  EXPECT_EQ(blasCoreLevel("Nehalem"), 0);
  EXPECT_EQ(blasCoreLevel("Sandybridge"), 1);
  EXPECT_EQ(blasCoreLevel("Haswell"), 2);
  EXPECT_EQ(blasCoreLevel("Zen"), 2);
  EXPECT_EQ(blasCoreLevel("SKYLAKEX"), 3);
  EXPECT_EQ(blasCoreLevel("Cooperlake"), 3);
  EXPECT_EQ(blasCoreLevel("Skylake"), -1);  // not a name of 0.3.21's
  EXPECT_EQ(blasCoreLevel(""), -1);
  EXPECT_EQ(blasCoreLevel("SkylakeXX"), -1);
}

TEST(BlasCore, ANarrowerCoreThanTheCpuRunsIsReplacedAndNoOtherIs) {
  const CpuVectors avx512{true, true, true}, avx2{true, true, false}, avx{true, false, false}, sse{};
  EXPECT_EQ(betterBlasCore("Prescott", avx512), "SkylakeX");
  EXPECT_EQ(betterBlasCore("Haswell", avx512), "SkylakeX");
  EXPECT_EQ(betterBlasCore("Zen", avx512), "SkylakeX");
  EXPECT_EQ(betterBlasCore("Prescott", avx2), "Haswell");
  EXPECT_EQ(betterBlasCore("Sandybridge", avx2), "Haswell");
  EXPECT_EQ(betterBlasCore("Prescott", avx), "Sandybridge");
  EXPECT_EQ(betterBlasCore("SkylakeX", avx512), "");
  EXPECT_EQ(betterBlasCore("Cooperlake", avx512), "");  // as wide: kept
  EXPECT_EQ(betterBlasCore("Zen", avx2), "");
  EXPECT_EQ(betterBlasCore("Prescott", sse), "");
  EXPECT_EQ(betterBlasCore("SomethingNewer", avx512), "");  // unknown: left alone
}

// What this machine's CPU runs, read from /proc/cpuinfo (not from the code
// under test): the widest core of the three troupe asks for.
std::string widestFromCpuinfo() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::string w;
    bool f = false, cd = false, bw = false, dq = false, vl = false, avx2 = false, fma = false, avx = false;
    while (words >> w) {
      f |= w == "avx512f", cd |= w == "avx512cd", bw |= w == "avx512bw", dq |= w == "avx512dq";
      vl |= w == "avx512vl", avx2 |= w == "avx2", fma |= w == "fma", avx |= w == "avx";
    }
    if (f && cd && bw && dq && vl) return "SkylakeX";
    if (avx2 && fma) return "Haswell";
    return avx ? "Sandybridge" : "";
  }
  return "";
}

std::pair<std::string, std::string> probe(const std::string& env, const std::string& detected) {
  // (env -u: whatever the test's own environment holds, the probe starts
  // without a core chosen.)
  auto r = testing::runProcess({"/bin/sh", "-c",
                                "exec env -u OPENBLAS_CORETYPE -u TROUPE_BLAS_CORE_CHOSEN_FROM -u TROUPE_BLAS_CORE " +
                                    env + " " + BLAS_CORE_PROBE + " " + detected},
                               std::chrono::seconds(30));
  EXPECT_EQ(r.exitCode, 0) << r.err;
  const auto nl = r.out.find('\n');
  if (nl == std::string::npos) return {"", r.out};
  return {r.out.substr(0, nl), r.out.substr(nl + 1, r.out.find('\n', nl + 1) - nl - 1)};
}

TEST(BlasCore, AProcessGivenAFallbackCoreStartsAgainOnTheWidestTheCpuRuns) {
  const std::string widest = widestFromCpuinfo();
  // OpenBLAS's own detection here, the check turned off.
  const auto [real, realWhy] = probe("TROUPE_BLAS_CORE=keep", "-");
  ASSERT_FALSE(real.empty()) << realWhy;
  if (widest.empty()) {
    // No AVX: no core is narrower than the CPU, so even a pretended
    // Prescott is kept, with no restart.
    const auto [core, why] = probe("", "Prescott");
    EXPECT_EQ(core, real) << why;
    EXPECT_EQ(why, real + " (detected by OpenBLAS)");
    return;
  }
  // As troupe starts: OpenBLAS's core where it is as wide as the CPU runs, else the widest.
  const auto [started, startedWhy] = probe("", "-");
  EXPECT_EQ(started, blasCoreLevel(real) >= blasCoreLevel(widest) ? real : widest) << startedWhy;
  // Pretend OpenBLAS picked Prescott: the process starts again on `widest`.
  const auto [core, why] = probe("", "Prescott");
  EXPECT_EQ(core, widest) << why;
  EXPECT_EQ(why, widest + " (chosen by troupe: OpenBLAS detected Prescott on a CPU that runs " + widest + ")");
  // A CPU pretended to stop at AVX2: Haswell comes back, which is not what
  // OpenBLAS detects here, so OpenBLAS took the variable after the restart.
  if (widest == "SkylakeX") {
    const auto [haswell, haswellWhy] = probe("", "Prescott avx2");
    EXPECT_EQ(haswell, "Haswell") << haswellWhy;
    EXPECT_NE(haswellWhy.find("chosen by troupe: OpenBLAS detected Prescott"), std::string::npos) << haswellWhy;
  }
  // Turned off: it stays on what OpenBLAS really picked.
  const auto [kept, keptWhy] = probe("TROUPE_BLAS_CORE=keep", "Prescott");
  EXPECT_EQ(kept, real) << keptWhy;
  // A core set by hand is kept, and the description says what it costs.
  const auto [hand, handWhy] = probe("OPENBLAS_CORETYPE=Prescott", "Prescott");
  EXPECT_EQ(hand, "Prescott") << handWhy;
  EXPECT_EQ(handWhy, "Prescott (OPENBLAS_CORETYPE=Prescott; this CPU runs " + widest + ", faster)");
}

}  // namespace
}  // namespace troupe::kernels
