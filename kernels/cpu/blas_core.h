// Which of OpenBLAS's kernels the dense layers run on, and making it the
// widest the CPU has.
//
// Debian's OpenBLAS is built with DYNAMIC_ARCH: when the library loads it
// picks a "core" (a set of kernels) from the CPU's model number. A CPU newer
// than the library (0.3.21 in Debian 12) can get a fallback: on the 16-core
// Xeon host the device tool lends, OpenBLAS picked "Prescott" (SSE3) on a
// CPU with AVX-512 (0.3.21 sends Intel models it does not know to Prescott),
// and the dense layers ran at about half the speed (bench/blas_core.sh
// measures the same cores here, bench/RESULTS.md). The core is fixed when
// the library loads, before main, so troupe's main calls
// chooseBlasCore first: where OpenBLAS picked a core with narrower vectors
// than the CPU's (and nobody chose one: OPENBLAS_CORETYPE unset), it starts
// itself again with OPENBLAS_CORETYPE set to the right one. The processes a
// job starts inherit the choice.
#pragma once

#include <string>
#include <string_view>

namespace troupe::kernels {

// The vector instructions the CPU has and the kernel allows (libgcc's
// __builtin_cpu_supports: CPUID and the OS's saved state).
struct CpuVectors {
  bool avx = false;
  bool avx2Fma = false;  // AVX2 and FMA
  bool avx512 = false;   // AVX-512 F, CD, BW, DQ and VL: what OpenBLAS's SkylakeX kernels use
};
CpuVectors hostCpuVectors();

// An OpenBLAS core's vector width by the instructions its kernels need:
// 0 SSE, 1 AVX, 2 AVX2, 3 AVX-512; -1 for a name this table does not know
// (a newer core: left alone). Case-insensitive, as OPENBLAS_CORETYPE is.
int blasCoreLevel(std::string_view core);

// The widest of OpenBLAS 0.3.21's x86-64 cores that `cpu` runs: SkylakeX,
// Haswell, Sandybridge, or "" (SSE only, or not x86-64).
std::string widestBlasCore(const CpuVectors& cpu);

// The core to ask for instead of `detected`, or "" to keep it: only where
// `detected` is a known core narrower than the widest `cpu` runs.
std::string betterBlasCore(std::string_view detected, const CpuVectors& cpu);

// Environment variables: the one OpenBLAS reads, and the one troupe sets
// beside it when it made the choice (holding the core OpenBLAS had
// detected), so that a process started again, and every process of the
// job, can say so. TROUPE_BLAS_CORE=keep turns the choice off.
inline constexpr const char* kOpenBlasCoreVariable = "OPENBLAS_CORETYPE";
inline constexpr const char* kChosenFromVariable = "TROUPE_BLAS_CORE_CHOSEN_FROM";
inline constexpr const char* kBlasCoreSwitch = "TROUPE_BLAS_CORE";

// Called first in main, before troupe starts any thread: where `detected` (what
// OpenBLAS picked) is narrower than `cpu` allows, OPENBLAS_CORETYPE is unset
// and TROUPE_BLAS_CORE is not "keep", sets the two variables and execs
// /proc/self/exe with `argv`. Returns only when it does not start again
// (or cannot: the exec failed, or the program runs under the dynamic
// loader, whose /proc/self/exe is the loader; with a line on stderr).
void chooseBlasCore(char** argv, std::string_view detected, const CpuVectors& cpu);
// The same with what OpenBLAS picked and this CPU's vectors.
void chooseBlasCore(char** argv);

// The core the dense layers run on now, and where it came from, in words:
// "SkylakeX (detected by OpenBLAS)", "SkylakeX (chosen by troupe: OpenBLAS
// detected Prescott on a CPU with AVX-512)", "Prescott (OPENBLAS_CORETYPE;
// this CPU runs SkylakeX)". For `troupe version` and the run log.
std::string blasCoreName();
std::string describeBlasCore();

}  // namespace troupe::kernels
