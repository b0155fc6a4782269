#include "actors/messages.h"

namespace troupe::actors {

std::vector<uint64_t> Roster::nodesOf(const std::string& role) const {
  size_t at = 0;
  for (size_t g = 0; g < roles.size() && g < counts.size(); ++g) {
    const size_t n = size_t(std::max<int64_t>(0, counts[g]));
    if (n > nodes.size() - at) return {};  // counts beyond the nodes (a malformed roster)
    if (roles[g] == role) {
      return std::vector<uint64_t>(nodes.begin() + int64_t(at), nodes.begin() + int64_t(at + n));
    }
    at += n;
  }
  return {};
}

transport::WireTypes lifecycleWireTypes() {
  transport::WireTypes t;
  t.add<Hello>("troupe.Hello")
      .add<Welcome>("troupe.Welcome")
      .add<Ready>("troupe.Ready")
      .add<Roster>("troupe.Roster")
      .add<Shutdown>("troupe.Shutdown")
      .add<MemberFailed>("troupe.MemberFailed")
      .add<Adopt>("troupe.Adopt")
      .add<Inject>("troupe.Inject")
      .add<FaultFired>("troupe.FaultFired")
      .add<LinkCounts>("troupe.LinkCounts");
  return t;
}

}  // namespace troupe::actors
