// LinkFaults: message faults injected on purpose (DESIGN.md, Fault injection),
// below the transport's reliable links (transport/internal/links.h), so the
// same filter runs on UCX and on the in-process twin.
//
// A rule hits user frames (actor messages, collective chunks) on the links
// it names, with a probability:
//   drop       the frame is not sent
//   duplicate  it is sent twice
//   delay      it is sent after a fixed or uniformly drawn delay
//   reorder    it is held back and sent after the next frame on its link
//              (or after reorderHold, if none comes)
//   corrupt    `bits` bits of its bytes are flipped on the way
//   partition  everything between the two sides, heartbeats included, is
//              dropped while the rule's window is open (probability 1)
// A link is named by its ends, "role:rank" names set with name() (a rule's
// "*" or a bare role matches more). A rule is open from startSeconds to
// endSeconds after the filter was made.
//
// Determinism: whether a rule hits a frame is a hash of (seed, the rule,
// the link's two names, the frame's number on its link, its attempt), not
// of the time or of other traffic: the same plan and seed hit the same
// messages in every run. Heartbeats and the transport's own frames are hit
// only by a partition.
//
// Threading: thread-safe (one mutex).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace troupe::transport {

enum class LinkFaultKind : uint8_t { kDrop, kDuplicate, kDelay, kReorder, kCorrupt, kPartition };
const char* linkFaultKindName(LinkFaultKind kind);

struct LinkFaultRule {
  LinkFaultKind kind = LinkFaultKind::kDrop;
  std::string from = "*";  // "role:rank", "role" (any rank) or "*"
  std::string to = "*";
  bool bothWays = false;   // also from `to` to `from` (a partition is always both ways)
  double probability = 1;  // per frame, 0..1
  std::chrono::microseconds delayMin{0}, delayMax{0};  // delay: uniform in [min, max]
  int bits = 1;            // corrupt: bits flipped per frame
  double startSeconds = 0;
  double endSeconds = 1e18;
};

// What the filter does to one frame.
struct LinkFaultAction {
  bool drop = false;
  int copies = 1;                          // 2: duplicated
  std::chrono::microseconds delay{0};
  bool reorder = false;
  std::vector<uint64_t> flipBits;          // bit offsets into the encoded frame, modulo its size
  int rule = -1;                           // the rule that hit (-1: none)
};

// Flips those bits of `frame` (each offset modulo its size in bits); a
// corrupt fault, applied once the frame is guarded as it goes on the wire.
void flipFrameBits(std::vector<std::byte>* frame, const std::vector<uint64_t>& bits);

class LinkFaults {
 public:
  // Rules' windows count from `start` (the wall clock, shared by every
  // process of a job on synchronized clocks), or from now when null.
  LinkFaults(uint64_t seed, std::vector<LinkFaultRule> rules,
             std::optional<std::chrono::system_clock::time_point> start = std::nullopt);

  // `node`'s name in rules ("worker:1"); a node without a name matches only "*".
  void name(uint64_t node, const std::string& roleRank);

  // The action for frame `seq` (its attempt `attempt`, 1 first) from `from` to `to`.
  // `user`: an actor message or collective frame (else only a partition hits it).
  LinkFaultAction decide(uint64_t from, uint64_t to, uint64_t seq, uint64_t attempt, bool user);

  // Frames each rule hit so far, by rule index.
  std::vector<uint64_t> injected() const;
  // The frames hit, in the order hit (the first kMaxHits): which rule,
  // which link, which frame and attempt.
  struct Hit {
    int rule = 0;
    uint64_t from = 0, to = 0, seq = 0, attempt = 0;
    bool operator==(const Hit& o) const {
      return rule == o.rule && from == o.from && to == o.to && seq == o.seq && attempt == o.attempt;
    }
  };
  static constexpr size_t kMaxHits = 100000;
  std::vector<Hit> hits() const;
  const std::vector<LinkFaultRule>& rules() const { return rules_; }
  // Seconds since the rules' windows started counting.
  double elapsedSeconds() const;

  // How long a reordered frame waits for a frame to go ahead of it.
  static constexpr std::chrono::milliseconds kReorderHold{50};

 private:
  bool matches(const std::string& pattern, const std::string& name) const;

  const uint64_t seed_;
  const std::vector<LinkFaultRule> rules_;
  const std::chrono::system_clock::time_point start_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::string> names_;
  std::vector<uint64_t> injected_;
  std::vector<Hit> hits_;
};

}  // namespace troupe::transport
