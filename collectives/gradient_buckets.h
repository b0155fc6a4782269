// GradientBuckets: all-reduce of a flat gradient buffer in buckets, each
// started as soon as backward has produced it, so communication overlaps
// the rest of backward (as DDP's reducer does).
//
// Buckets are fixed when built: the ranges of the buffer in the order
// backward fills them, grouped into runs of consecutive ranges that are
// adjacent in memory, up to bucketBytes each (a bigger range is a bucket of
// its own). Parts of the buffer no range covers are reduced at finish().
//
// A step: ready(range) for each range as backward finishes it (the compute
// thread), then finish() (waits for every bucket). Buckets are launched in
// their fixed order on every rank, whatever order ready() is called in, so
// every rank issues the same collectives in the same order.
//
// Threading: ready() and finish() from one thread; the reductions run on the
// object's own communication thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/compressed_allreduce.h"

namespace troupe::collectives {

struct GradRange {
  int64_t offset = 0, count = 0;  // floats
};

struct BucketStats {
  int64_t buckets = 0;       // per step
  int64_t steps = 0;
  double reduceSeconds = 0;  // time on the communication thread
  double waitSeconds = 0;    // time finish() waited: communication not hidden by backward
};

class GradientBuckets final {
 public:
  // Ranges must lie in [0, size) and not overlap (checked; throws SetupError).
  GradientBuckets(std::shared_ptr<Communicator> comm, float* grads, int64_t size, const std::vector<GradRange>& order,
                  int64_t bucketBytes, ReduceOp op = ReduceOp::kAverage);
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // Backward has written this range (one given at construction).
  void ready(int64_t offset, int64_t count);
  // Launches what is left, waits for every bucket; the first error of the
  // step, if any.
  Status finish();

  // compression.allreduce: buckets go through `reducer` (averages; its
  // residuals keyed by bucket) from now on; null: plain all-reduce. The
  // bytes are counted under the transport's "allreduce" label either way.
  void setCompression(std::shared_ptr<CompressedAllReduce> reducer);
  // The training step the buckets reduced from now on belong to (the same
  // on every rank); call before the step's first ready().
  void setStep(int64_t step);
  const CompressedAllReduce* compression() const { return reducer_.get(); }

  const std::vector<GradRange>& buckets() const { return buckets_; }
  BucketStats stats() const;

 private:
  void launchReady();  // under mutex_
  void run();

  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<CompressedAllReduce> reducer_;  // guarded by mutex_ (set between steps)
  int64_t step_ = 0;
  float* grads_;
  ReduceOp op_;
  std::vector<GradRange> buckets_;
  std::vector<int> rangesPerBucket_;
  std::map<int64_t, int> bucketOfRange_;  // range offset -> bucket

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<int> pending_;  // ranges not yet ready, per bucket, this step
  size_t nextLaunch_ = 0;
  std::deque<size_t> queue_;
  size_t done_ = 0;
  Status status_;
  bool stop_ = false;
  BucketStats stats_;
  std::thread thread_;
};

}  // namespace troupe::collectives
