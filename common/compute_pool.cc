#include "common/compute_pool.h"

#include <algorithm>

#include "common/check.h"

namespace troupe {
namespace {
thread_local const ComputePool* tCurrentPool = nullptr;
}  // namespace

ComputePool::ComputePool(int threads) : threads_(threads) {
  if (threads < 1) TROUPE_SETUP_ERROR("ComputePool needs at least 1 thread, got {}", threads);
  workers_.reserve(threads - 1);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { workerLoop(i); });
}

ComputePool::~ComputePool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

int ComputePool::hardwareThreads() {
  return std::max(1u, std::thread::hardware_concurrency());
}

void ComputePool::parallelFor(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (threads_ == 1 || n < 2 * grain || tCurrentPool == this) {
    fn(0, n);
    return;
  }
  std::lock_guard callLock(callMu_);
  const int64_t maxChunks = std::min<int64_t>(int64_t(threads_) * 4, n / grain);
  const int64_t chunk = (n + maxChunks - 1) / maxChunks;
  std::unique_lock lock(mu_);
  fn_ = &fn;
  n_ = n;
  chunk_ = chunk;
  chunks_ = (n + chunk - 1) / chunk;
  nextChunk_ = 0;
  pending_ = chunks_;
  ++generation_;
  lock.unlock();
  wake_.notify_all();

  tCurrentPool = this;
  for (;;) {
    lock.lock();
    if (nextChunk_ >= chunks_) break;
    const int64_t c = nextChunk_++;
    lock.unlock();
    fn(c * chunk, std::min(n, (c + 1) * chunk));
    lock.lock();
    --pending_;
    lock.unlock();
  }
  tCurrentPool = nullptr;
  done_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
}

void ComputePool::workerLoop(int) {
  tCurrentPool = this;
  uint64_t seen = 0;
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || (generation_ != seen && nextChunk_ < chunks_); });
    if (stop_) return;
    seen = generation_;
    while (nextChunk_ < chunks_) {
      const int64_t c = nextChunk_++;
      const auto* fn = fn_;
      const int64_t begin = c * chunk_, end = std::min(n_, (c + 1) * chunk_);
      lock.unlock();
      (*fn)(begin, end);
      lock.lock();
      if (--pending_ == 0) done_.notify_all();
    }
  }
}

}  // namespace troupe
