// ComputePool: a fixed set of compute threads for kernels (DESIGN.md, Threads).
//
// parallelFor splits [0, n) into contiguous chunks of at least `grain` items
// and runs fn(begin, end) on the pool's threads and the calling thread, then
// returns when every chunk is done. An idle thread checks for the next call
// for about 200 us (calls of a training step come close together), then sleeps on
// a condition variable; a call wakes sleepers only. With threads == 1, or when
// n is below 2 * grain, fn runs inline on the caller.
//
// Thread safety: one parallelFor at a time per pool (calls from several
// threads are serialised). fn must not throw; a call from inside fn on the same
// pool runs inline (no nested parallelism, no deadlock).
#pragma once

#include <atomic>
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
  struct Call {
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    int64_t n = 0, chunk = 0, chunks = 0;
    uint64_t generation = 0;
  };
  // Claims and runs one chunk of `call`; false when none is left (or the pool
  // has moved on to another call).
  bool runOneChunk(const Call& call);

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex callMu_;  // serialises parallelFor callers
  std::mutex mu_;      // guards the call's parameters, sleepers_, callerSleeping_
  std::condition_variable wake_;
  std::condition_variable done_;
  Call call_;                          // the current call, guarded by mu_
  std::atomic<uint64_t> claim_{0};     // (generation << 32) | next chunk
  std::atomic<int64_t> pending_{0};    // chunks of the current call not done
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  int sleepers_ = 0;
  bool callerSleeping_ = false;
};

}  // namespace troupe
