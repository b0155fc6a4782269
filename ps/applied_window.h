// Which pushes of one worker a shard has applied, by sequence number: every
// number below floor(), and those above it that arrived early (out of
// order). A push is applied exactly once: one whose number the window holds
// is a duplicate, acknowledged without being applied again; one that arrives
// after a later one is still applied (nothing already acknowledged is lost,
// whatever order retries take). Memory is the out-of-order ones only.
#pragma once

#include <cstdint>
#include <set>
#include <vector>

namespace troupe::ps {

class AppliedWindow {
 public:
  AppliedWindow() = default;
  // A window restored from a checkpoint.
  AppliedWindow(int64_t floor, const std::vector<int64_t>& early) : floor_(floor), early_(early.begin(), early.end()) {}

  // How far above the floor a sequence number may be (a worker more pushes
  // ahead of its oldest unapplied one than this is refused as malformed).
  static constexpr int64_t kMaxLead = int64_t{1} << 20;

  bool contains(int64_t sequence) const { return sequence < floor_ || early_.count(sequence) > 0; }
  // Whether `sequence` may be recorded (non-negative, within kMaxLead).
  bool acceptable(int64_t sequence) const { return sequence >= 0 && sequence - floor_ <= kMaxLead; }
  // Records an applied push; false when it was recorded already.
  bool insert(int64_t sequence) {
    if (contains(sequence)) return false;
    if (sequence == floor_) {
      ++floor_;
      while (!early_.empty() && *early_.begin() == floor_) {
        early_.erase(early_.begin());
        ++floor_;
      }
    } else {
      early_.insert(sequence);
    }
    return true;
  }
  // Every number from `sequence` on counts as not applied (their updates
  // were undone).
  void forgetFrom(int64_t sequence) {
    if (floor_ > sequence) floor_ = sequence;
    early_.erase(early_.lower_bound(sequence), early_.end());
  }
  // The lowest sequence number not applied yet.
  int64_t floor() const { return floor_; }
  size_t early() const { return early_.size(); }
  std::vector<int64_t> earlyList() const { return {early_.begin(), early_.end()}; }

 private:
  int64_t floor_ = 0;
  std::set<int64_t> early_;
};

}  // namespace troupe::ps
