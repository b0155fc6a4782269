#include "transport/link_faults.h"

#include "common/hash.h"

namespace troupe::transport {

const char* linkFaultKindName(LinkFaultKind kind) {
  switch (kind) {
    case LinkFaultKind::kDrop: return "drop";
    case LinkFaultKind::kDuplicate: return "dup";
    case LinkFaultKind::kDelay: return "delay";
    case LinkFaultKind::kReorder: return "reorder";
    case LinkFaultKind::kCorrupt: return "corrupt";
    case LinkFaultKind::kPartition: return "partition";
  }
  return "?";
}

LinkFaults::LinkFaults(uint64_t seed, std::vector<LinkFaultRule> rules,
                       std::optional<std::chrono::system_clock::time_point> start)
    : seed_(seed),
      rules_(std::move(rules)),
      start_(start ? *start : std::chrono::system_clock::now()),
      injected_(rules_.size(), 0) {}

void LinkFaults::name(uint64_t node, const std::string& roleRank) {
  std::lock_guard<std::mutex> lock(mu_);
  names_[node] = roleRank;
}

double LinkFaults::elapsedSeconds() const {
  return std::chrono::duration<double>(std::chrono::system_clock::now() - start_).count();
}

bool LinkFaults::matches(const std::string& pattern, const std::string& name) const {
  if (pattern == "*") return true;
  if (name.empty()) return false;
  if (pattern == name) return true;
  // A bare role matches every rank of it.
  return pattern.find(':') == std::string::npos && name.size() > pattern.size() &&
         name.compare(0, pattern.size(), pattern) == 0 && name[pattern.size()] == ':';
}

std::vector<LinkFaults::Hit> LinkFaults::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

std::vector<uint64_t> LinkFaults::injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

LinkFaultAction LinkFaults::decide(uint64_t from, uint64_t to, uint64_t seq, uint64_t attempt, bool user) {
  LinkFaultAction a;
  const double now = elapsedSeconds();
  std::lock_guard<std::mutex> lock(mu_);
  const auto f = names_.find(from);
  const auto t = names_.find(to);
  const std::string fromName = f == names_.end() ? std::string() : f->second;
  const std::string toName = t == names_.end() ? std::string() : t->second;
  for (size_t i = 0; i < rules_.size(); ++i) {
    const LinkFaultRule& r = rules_[i];
    if (now < r.startSeconds || now >= r.endSeconds) continue;
    const bool both = r.bothWays || r.kind == LinkFaultKind::kPartition;
    const bool forward = matches(r.from, fromName) && matches(r.to, toName);
    const bool backward = both && matches(r.from, toName) && matches(r.to, fromName);
    if (!forward && !backward) continue;
    if (r.kind == LinkFaultKind::kPartition) {
      a.drop = true;
      a.rule = int(i);
      injected_[i]++;
      if (hits_.size() < kMaxHits) hits_.push_back(Hit{int(i), from, to, seq, attempt});
      return a;
    }
    if (!user) continue;
    // The draw: a hash of what names this frame, not of when it went.
    uint64_t h = hashCombine(seed_, i + 1);
    h = hashCombine(h, hashBytes(fromName.empty() ? std::to_string(from) : fromName));
    h = hashCombine(h, hashBytes(toName.empty() ? std::to_string(to) : toName));
    h = hashCombine(h, seq);
    h = hashCombine(h, attempt);
    const double u = double(h >> 11) * (1.0 / 9007199254740992.0);
    if (u >= r.probability) continue;
    injected_[i]++;
    if (hits_.size() < kMaxHits) hits_.push_back(Hit{int(i), from, to, seq, attempt});
    a.rule = int(i);
    switch (r.kind) {
      case LinkFaultKind::kDrop: a.drop = true; break;
      case LinkFaultKind::kDuplicate: a.copies = 2; break;
      case LinkFaultKind::kDelay: {
        const int64_t lo = r.delayMin.count(), hi = std::max(r.delayMin.count(), r.delayMax.count());
        a.delay = std::chrono::microseconds(lo + int64_t(mix64(h) % uint64_t(hi - lo + 1)));
        break;
      }
      case LinkFaultKind::kReorder: a.reorder = true; break;
      case LinkFaultKind::kCorrupt: {
        uint64_t x = h;
        for (int b = 0; b < std::max(1, r.bits); ++b) {
          x = mix64(x + 0x9e3779b97f4a7c15ULL);
          a.flipBits.push_back(x);
        }
        break;
      }
      case LinkFaultKind::kPartition: break;
    }
    return a;
  }
  return a;
}

void flipFrameBits(std::vector<std::byte>* frame, const std::vector<uint64_t>& bits) {
  if (frame->empty()) return;
  for (uint64_t bit : bits) {
    const uint64_t at = bit % (frame->size() * 8);
    (*frame)[at / 8] ^= std::byte(1u << (at % 8));
  }
}

}  // namespace troupe::transport
