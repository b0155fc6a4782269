#include "collectives/gradient_buckets.h"

#include <algorithm>
#include <chrono>

#include "common/check.h"

namespace troupe::collectives {
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

GradientBuckets::GradientBuckets(std::shared_ptr<Communicator> comm, float* grads, int64_t size,
                                 const std::vector<GradRange>& order, int64_t bucketBytes, ReduceOp op)
    : comm_(std::move(comm)), grads_(grads), op_(op) {
  TROUPE_CHECK(comm_ != nullptr, "GradientBuckets without a communicator");
  if (bucketBytes < 4) TROUPE_SETUP_ERROR("gradient bucket size must be at least 4 bytes, not {}", bucketBytes);
  // Validate: in bounds, no overlap.
  std::vector<GradRange> sorted;
  for (const auto& r : order) {
    if (r.count <= 0) continue;
    if (r.offset < 0 || r.offset + r.count > size) {
      TROUPE_SETUP_ERROR("gradient range [{}, {}) lies outside the buffer of {}", r.offset, r.offset + r.count, size);
    }
    sorted.push_back(r);
  }
  std::sort(sorted.begin(), sorted.end(), [](const GradRange& a, const GradRange& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].offset < sorted[i - 1].offset + sorted[i - 1].count) {
      TROUPE_SETUP_ERROR("gradient ranges at {} and {} overlap", sorted[i - 1].offset, sorted[i].offset);
    }
  }
  const int64_t maxFloats = std::max<int64_t>(1, bucketBytes / 4);
  for (const auto& r : order) {
    if (r.count <= 0) continue;
    if (!buckets_.empty()) {
      GradRange& b = buckets_.back();
      const bool adjacent = r.offset + r.count == b.offset || b.offset + b.count == r.offset;
      if (adjacent && b.count + r.count <= maxFloats) {
        b.offset = std::min(b.offset, r.offset);
        b.count += r.count;
        ++rangesPerBucket_.back();
        bucketOfRange_[r.offset] = int(buckets_.size() - 1);
        continue;
      }
    }
    buckets_.push_back(r);
    rangesPerBucket_.push_back(1);
    bucketOfRange_[r.offset] = int(buckets_.size() - 1);
  }
  // What no range covers, reduced at finish().
  int64_t at = 0;
  for (const auto& r : sorted) {
    if (r.offset > at) {
      buckets_.push_back(GradRange{at, r.offset - at});
      rangesPerBucket_.push_back(1);  // never ready(): launched by finish()
    }
    at = r.offset + r.count;
  }
  if (at < size) {
    buckets_.push_back(GradRange{at, size - at});
    rangesPerBucket_.push_back(1);
  }
  pending_ = rangesPerBucket_;
  stats_.buckets = int64_t(buckets_.size());
  thread_ = std::thread([this] { run(); });
}

GradientBuckets::~GradientBuckets() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void GradientBuckets::ready(int64_t offset, int64_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = bucketOfRange_.find(offset);
  TROUPE_CHECK(it != bucketOfRange_.end() && count > 0, "ready({}, {}) is not a gradient range", offset, count);
  --pending_[size_t(it->second)];
  launchReady();
}

void GradientBuckets::launchReady() {
  bool any = false;
  while (nextLaunch_ < buckets_.size() && pending_[nextLaunch_] <= 0) {
    queue_.push_back(nextLaunch_++);
    any = true;
  }
  if (any) cv_.notify_all();
}

Status GradientBuckets::finish() {
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  for (auto& p : pending_) p = 0;
  launchReady();
  cv_.wait(lock, [&] { return done_ == buckets_.size(); });
  Status s = status_;
  status_ = Status::ok();
  done_ = 0;
  nextLaunch_ = 0;
  pending_ = rangesPerBucket_;
  stats_.steps++;
  stats_.waitSeconds += since(start);
  return s;
}

void GradientBuckets::setCompression(std::shared_ptr<CompressedAllReduce> reducer) {
  std::lock_guard<std::mutex> lock(mutex_);
  reducer_ = std::move(reducer);
}

void GradientBuckets::setStep(int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
}

BucketStats GradientBuckets::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void GradientBuckets::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const size_t b = queue_.front();
    queue_.pop_front();
    const bool failed = !status_.isOk();
    CompressedAllReduce* reducer = reducer_.get();
    const int64_t step = step_;
    lock.unlock();
    Status s;
    const auto start = Clock::now();
    if (!failed) {
      comm_->setTrafficLabel("allreduce");
      if (reducer != nullptr && op_ == ReduceOp::kAverage) {
        s = reducer->reduce(*comm_, int(b), grads_ + buckets_[b].offset, buckets_[b].count, step);
      } else {
        s = comm_->allReduce(grads_ + buckets_[b].offset, size_t(buckets_[b].count), DType::kFloat32, op_);
      }
      comm_->setTrafficLabel("collective");
    }
    const double took = since(start);
    lock.lock();
    stats_.reduceSeconds += took;
    if (!s.isOk() && status_.isOk()) status_ = s;
    ++done_;
    cv_.notify_all();
  }
}

}  // namespace troupe::collectives
