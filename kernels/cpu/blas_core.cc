#include "kernels/cpu/blas_core.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>

#include <cblas.h>
#include <fmt/format.h>

namespace troupe::kernels {

CpuVectors hostCpuVectors() {
  CpuVectors v;
#if defined(__x86_64__)
  __builtin_cpu_init();
  v.avx = __builtin_cpu_supports("avx");
  v.avx2Fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  v.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#endif
  return v;
}

int blasCoreLevel(std::string_view core) {
  struct Known {
    const char* name;
    int level;
  };
  // OpenBLAS 0.3.21's x86-64 DYNAMIC_ARCH cores (driver/others/dynamic.c).
  static constexpr std::array<Known, 25> kKnown = {{
      {"Katmai", 0},      {"Coppermine", 0},  {"Northwood", 0},  {"Prescott", 0},   {"Banias", 0},
      {"Atom", 0},        {"Core2", 0},       {"Penryn", 0},     {"Dunnington", 0}, {"Nehalem", 0},
      {"Athlon", 0},      {"Opteron", 0},     {"Opteron_SSE3", 0}, {"Barcelona", 0}, {"Nano", 0},
      {"Bobcat", 0},      {"Sandybridge", 1}, {"Bulldozer", 1},  {"Piledriver", 1}, {"Steamroller", 1},
      {"Haswell", 2},     {"Excavator", 2},   {"Zen", 2},        {"SkylakeX", 3},   {"Cooperlake", 3},
  }};
  for (const auto& k : kKnown) {
    if (core.size() == std::strlen(k.name) && ::strncasecmp(core.data(), k.name, core.size()) == 0) return k.level;
  }
  return -1;
}

std::string widestBlasCore(const CpuVectors& cpu) {
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2Fma) return "Haswell";
  if (cpu.avx) return "Sandybridge";
  return "";
}

std::string betterBlasCore(std::string_view detected, const CpuVectors& cpu) {
  const std::string widest = widestBlasCore(cpu);
  const int have = blasCoreLevel(detected);
  if (widest.empty() || have < 0 || have >= blasCoreLevel(widest)) return "";
  return widest;
}

void chooseBlasCore(char** argv, std::string_view detected, const CpuVectors& cpu) {
  if (std::getenv(kOpenBlasCoreVariable) != nullptr) return;  // chosen by hand, or by us already
  if (const char* s = std::getenv(kBlasCoreSwitch); s != nullptr && std::strcmp(s, "keep") == 0) return;
  const std::string better = betterBlasCore(detected, cpu);
  if (better.empty()) return;
  // Under the dynamic loader (ld.so troupe ...) /proc/self/exe is the
  // loader, which would take argv[1] for the program.
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  const std::string self = n > 0 ? std::string(exe, size_t(n)) : std::string();
  const bool loader = self.find("/ld-linux") != std::string::npos || self.find("/ld.so") != std::string::npos;
  const char* why = loader ? "it runs under the dynamic loader" : nullptr;
  if (!loader) {
    ::setenv(kOpenBlasCoreVariable, better.c_str(), 1);
    ::setenv(kChosenFromVariable, std::string(detected).c_str(), 1);
    ::execv("/proc/self/exe", argv);
    why = std::strerror(errno);
  }
  // Still here: go on with the core OpenBLAS picked, saying so.
  std::fprintf(stderr,
               "troupe: warning: OpenBLAS picked its %.*s kernels on a CPU that runs %s; troupe could not start "
               "again with OPENBLAS_CORETYPE=%s (%s): the dense layers run slower. Set OPENBLAS_CORETYPE=%s "
               "yourself.\n",
               int(detected.size()), detected.data(), better.c_str(), better.c_str(), why, better.c_str());
  ::unsetenv(kOpenBlasCoreVariable);
  ::unsetenv(kChosenFromVariable);
}

std::string blasCoreName() {
  const char* name = openblas_get_corename();
  return name != nullptr ? std::string(name) : std::string("unknown");
}

void chooseBlasCore(char** argv) { chooseBlasCore(argv, blasCoreName(), hostCpuVectors()); }

std::string describeBlasCore() {
  const std::string core = blasCoreName();
  const CpuVectors cpu = hostCpuVectors();
  const std::string widest = widestBlasCore(cpu);
  const char* set = std::getenv(kOpenBlasCoreVariable);
  const char* from = std::getenv(kChosenFromVariable);
  if (set != nullptr && ::strcasecmp(set, core.c_str()) != 0) {
    return fmt::format("{} (OpenBLAS did not take {}={})", core, kOpenBlasCoreVariable, set);
  }
  if (set != nullptr && from != nullptr) {
    return fmt::format("{} (chosen by troupe: OpenBLAS detected {} on a CPU that runs {})", core, from,
                       widest.empty() ? core : widest);
  }
  const std::string better = betterBlasCore(core, cpu);
  if (set != nullptr) {
    return better.empty() ? fmt::format("{} ({}={})", core, kOpenBlasCoreVariable, set)
                          : fmt::format("{} ({}={}; this CPU runs {}, faster)", core, kOpenBlasCoreVariable, set,
                                        better);
  }
  if (better.empty()) return fmt::format("{} (detected by OpenBLAS)", core);
  const char* keep = std::getenv(kBlasCoreSwitch);
  return fmt::format("{} (detected by OpenBLAS; this CPU runs {}, faster{})", core, better,
                     keep != nullptr && std::strcmp(keep, "keep") == 0
                         ? fmt::format(": {}=keep is set", kBlasCoreSwitch)
                         : fmt::format(": set {}={}", kOpenBlasCoreVariable, better));
}

}  // namespace troupe::kernels
