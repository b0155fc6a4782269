// libFuzzer target for the fault-plan parser (actors/fault_plan.h): each line
// of the input is one --fault SPEC of a job of 4 workers and 2 parameter
// servers. Any plan parses or is refused with a SetupError, never a crash or
// another exception. TROUPE_FUZZ_SEEDS=DIR writes seeds there.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "actors/fault_plan.h"
#include "common/check.h"
#include "common/config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("TROUPE_FUZZ_SEEDS");
  if (!dir) return 0;
  const char* seeds[] = {
      "kind=kill,target=worker:1,at_step=40\nkind=stop, target=ps:0, at_s=2.5, duration_s=8",
      "kind=kill,target=ps,every_s=20,count=3\nkind=slow,target=worker:0,factor=3,at_step=10,steps=50",
      "kind=drop,from=worker,to=ps:1,p=0.05\nkind=delay,from=ps,to=worker:0,p=0.1,delay_ms=2-30,at_s=1,duration_s=4",
      "kind=partition,target=ps:0,at_s=5,duration_s=2\nkind=corrupt,p=1,bits=3,both_ways=true",
      "kind=kill,target=worker:1,actor=train-loader,at_step=7\nkind=kill-actor,target=ps:0,actor=shard,at_s=1.5",
      "kind=slow,target=worker:1,delay_ms=25\nkind=dup,from=*,p=0.1",
  };
  int n = 0;
  for (const char* s : seeds) std::ofstream(std::string(dir) + "/seed-" + std::to_string(n++)) << s;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  static const troupe::Config kDefaults(troupe::troupeConfigSchema());
  troupe::Config c = kDefaults;  // (a copy: building the schema each time would be most of the work)
  try {
    troupe::fuzz::forEachLine(text, [&](std::string_view line) {
      c.append("faults.plan", std::string(line));  // (refuses text that is not UTF-8)
    });
    (void)troupe::actors::parseFaultPlan(c, 4, 2);
  } catch (const troupe::SetupError&) {
  }
  return 0;
}
