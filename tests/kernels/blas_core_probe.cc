// For blas_core_test: a program that starts as troupe's main does, but with
// OpenBLAS's detection replaced by argv[1] (`-` for what OpenBLAS really
// detected) and, with argv[2] = avx2, the CPU's vectors by AVX2 without
// AVX-512; then prints the core the dense layers run on and its
// description, a line each.
#include <cstdio>
#include <string>

#include "kernels/cpu/blas_core.h"

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string detected = std::string(argv[1]) == "-" ? troupe::kernels::blasCoreName() : argv[1];
  troupe::kernels::CpuVectors cpu = troupe::kernels::hostCpuVectors();
  if (argc > 2 && std::string(argv[2]) == "avx2") cpu.avx512 = false;
  troupe::kernels::chooseBlasCore(argv, detected, cpu);
  std::printf("%s\n%s\n", troupe::kernels::blasCoreName().c_str(), troupe::kernels::describeBlasCore().c_str());
  return 0;
}
