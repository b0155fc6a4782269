// libFuzzer target for the config parser (common/config.h) with the
// product's schema: TOML text a user wrote by hand, or --set assignments.
// Any input is loaded or refused with a SetupError, never a crash or another
// exception; what loads must dump to TOML that loads back to the same dump.
//
// The first byte picks: even, the rest is a TOML file; odd, each line of the
// rest is a --set KEY=VALUE. TROUPE_FUZZ_SEEDS=DIR writes seeds there.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/check.h"
#include "common/config.h"
#include "tests/fuzz/fuzz_util.h"

using troupe::fuzz::writeSeed;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("TROUPE_FUZZ_SEEDS");
  if (!dir) return 0;
  troupe::Config c(troupe::troupeConfigSchema());
  writeSeed(dir, 0, 0, c.toToml());
  writeSeed(dir, 1, 0,
            "[train]\nbatch_size = 128\ndense_lr = 0.01\n[model]\nkind = \"mlp\"\nhidden = [64, 32]\n"
            "[faults]\nplan = [\"kind=kill,target=worker:1,at_step=5\"]\n");
  writeSeed(dir, 2, 1, "train.batch_size=64\ntrain.dense_lr=nan\nmodel.hidden=[8,4]\nrun.name=\"x\\\"y\"\n");
  writeSeed(dir, 3, 1, "transport.listen_port=65536\ncluster.workers=-1\ndata.synthetic.seed=9007199254740993\n");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  static const troupe::Config kDefaults(troupe::troupeConfigSchema());
  troupe::Config c = kDefaults;  // (a copy: building the schema each time would be most of the work)
  try {
    if (data[0] % 2 == 0) {
      c.loadString(rest, "fuzz.toml");
    } else {
      troupe::fuzz::forEachLine(rest, [&](std::string_view line) { c.set(line); });
    }
  } catch (const troupe::SetupError&) {
    return 0;
  }
  const std::string dump = c.toToml();
  troupe::Config again = kDefaults;
  try {
    again.loadString(dump, "dump");
  } catch (const troupe::SetupError&) {
    std::abort();  // what loaded must dump to something that loads
  }
  if (again.toToml() != dump) std::abort();
  return 0;
}
