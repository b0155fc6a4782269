// ComputePool: a fixed set of compute threads for kernels (DESIGN.md, Threads).
//
// parallelFor splits [0, n) into contiguous chunks of at least `grain` items
// and runs fn(begin, end) on the pool's threads and the calling thread, then
// returns when every chunk is done. Idle threads sleep on a condition variable;
// nothing spins. With threads == 1, or when n is below 2 * grain, fn runs
// inline on the caller.
//
// Thread safety: one parallelFor at a time per pool (calls from several
// threads are serialised). fn must not throw; a call from inside fn on the same
// pool runs inline (no nested parallelism, no deadlock).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe {

class ComputePool final {
 public:
  // threads >= 1 counts the caller: a pool of 2 starts one extra thread.
  explicit ComputePool(int threads);
  ~ComputePool();
  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;

  int threads() const { return threads_; }

  void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The number of hardware threads, at least 1.
  static int hardwareThreads();

 private:
  void workerLoop(int index);

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex callMu_;  // serialises parallelFor callers
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  int64_t chunks_ = 0;
  int64_t nextChunk_ = 0;
  int64_t pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace troupe
