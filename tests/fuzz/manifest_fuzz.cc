// libFuzzer target for the checkpoint manifest reader (workers/checkpoint.h,
// parseManifest): a manifest on disk may be truncated, corrupted or written
// by hand. Any input gives a manifest or an error, never a crash.
//
// The first byte picks: even, the rest is the manifest as it is (its own
// checksum must hold, so almost every input stops there); odd, a correct
// checksum line is appended to the rest first, so the TOML and every field
// check are reached. TROUPE_FUZZ_SEEDS=DIR writes a real manifest there.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <fmt/format.h>

#include "common/checksum_file.h"
#include "workers/checkpoint.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("TROUPE_FUZZ_SEEDS");
  if (!dir) return 0;
  namespace fs = std::filesystem;
  const fs::path base = fs::temp_directory_path() / fmt::format("troupe-manifest-seed-{}", ::getpid());
  const std::string ck = troupe::workers::checkpointDir(base.string(), 3);
  fs::create_directories(ck);
  troupe::workers::CheckpointManifest m;
  m.id = 3;
  m.created = "2026-11-26T22:00:00Z";
  m.shape.model = "dlrm";
  m.shape.mode = "ps";
  m.shape.consistency = "bsp";
  m.shape.workers = 2;
  m.shape.servers = 1;
  m.shape.tableDims = {16, 16};
  m.shape.denseParameters = 1234;
  m.shape.embeddingOptimizer = "adagrad";
  m.shape.denseOptimizer = "adam";
  m.workerSteps = {10, 11};
  m.samplesApplied = {5376};
  m.divisions = {{0, 0, 2}};
  m.config = {"config.toml", 100, 0x0123456789abcdefULL};
  m.shards = {{"shard-0.bin", 4096, 0x1111111111111111ULL}};
  if (!troupe::workers::writeManifest(ck, m).isOk()) std::abort();
  std::ifstream in(fs::path(ck) / troupe::workers::kManifestFile, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(std::string(dir) + "/seed-0", std::ios::binary) << '\0' << text;
  const size_t at = text.rfind("\nmanifest_checksum");
  std::ofstream(std::string(dir) + "/seed-1", std::ios::binary) << '\1' << text.substr(0, at);
  fs::remove_all(base);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 1) {
    text += fmt::format("\nmanifest_checksum = \"{:016x}\"\n", troupe::xxh3(text.data(), text.size()));
  }
  (void)troupe::workers::parseManifest(text, "fuzz/manifest.toml");
  return 0;
}
