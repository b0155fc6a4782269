// Replays a fuzz target's corpus as an ordinary test: every file under the
// directories (or the files) on the command line goes through the target's
// LLVMFuzzerTestOneInput once, as libFuzzer replays a corpus. Any crash, an
// abort from a target's own check or an uncaught exception fails the test.
// In the ordinary build (any compiler) each target in tests/fuzz links this
// main; with TROUPE_FUZZ=ON and clang the same sources link libFuzzer
// instead, for campaigns (tests/fuzz/campaign.sh).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <csignal>
#include <cstring>
#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

// The input being replayed, named if it crashes the target.
char gCurrent[4096] = "";

void onCrash(int sig) {
  const char head[] = "\nfuzz replay: crashed on ";
  [[maybe_unused]] ssize_t n = ::write(2, head, sizeof head - 1);
  n = ::write(2, gCurrent, std::strlen(gCurrent));
  n = ::write(2, "\n", 1);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, onCrash);
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    if (fs::is_directory(argv[i], ec)) {
      for (const auto& e : fs::recursive_directory_iterator(argv[i])) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else if (fs::is_regular_file(argv[i], ec)) {
      files.emplace_back(argv[i]);
    } else {
      std::fprintf(stderr, "%s: %s: no such file or directory\n", argv[0], argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "%s: no corpus files given\n", argv[0]);
    return 2;
  }
  size_t bytes = 0;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "%s: cannot read %s\n", argv[0], f.c_str());
      return 2;
    }
    // (A copy of exactly its size, so that a read past the end is one.)
    std::vector<uint8_t> exact(data.begin(), data.end());
    std::snprintf(gCurrent, sizeof gCurrent, "%s", f.c_str());
    LLVMFuzzerTestOneInput(exact.data(), exact.size());
    bytes += exact.size();
  }
  std::printf("%s: %zu inputs (%zu bytes) replayed, none crashed\n", argv[0], files.size(), bytes);
  return 0;
}
