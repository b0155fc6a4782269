#include "common/compute_pool.h"

#include <algorithm>
#include <chrono>

#include "common/check.h"

namespace troupe {
namespace {

thread_local const ComputePool* tCurrentPool = nullptr;

// How long an idle thread keeps checking for the next call before it sleeps.
// Kernel calls of a training step come close together; a spin saves the
// futex wake-up and context switch (~10 us each) per call, and an idle pool
// still sleeps within this bound. Measured on 2 cores (bench/RESULTS.md,
// "The compute pool's spin"): the gaps inside a step (the loss, the
// optimizer's bookkeeping, the actors' messages) often exceed 30 us; at 30
// us the threads slept through them and the MLP and DLRM trained 10-12%
// slower than at 100-500 us, where it levels off.
constexpr auto kSpin = std::chrono::microseconds(200);

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until pred() holds or kSpin passes; returns pred().
template <typename Pred>
bool spinFor(const Pred& pred) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (pred()) return true;
    cpuRelax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= deadline) return pred();
  }
}

}  // namespace

ComputePool::ComputePool(int threads) : threads_(threads) {
  if (threads < 1) TROUPE_SETUP_ERROR("ComputePool needs at least 1 thread, got {}", threads);
  workers_.reserve(threads - 1);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { workerLoop(i); });
}

ComputePool::~ComputePool() {
  {
    std::lock_guard lock(mu_);
    stop_.store(true);
    call_ = Call{};
    call_.generation = generation_.load() + 1;
    generation_.store(call_.generation);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

int ComputePool::hardwareThreads() {
  return std::max(1u, std::thread::hardware_concurrency());
}

bool ComputePool::runOneChunk(const Call& call) {
  // claim_ packs (generation << 32 | next chunk); a claim succeeds only for the
  // call it was made for, so a late thread never runs a chunk of another call.
  uint64_t v = claim_.load(std::memory_order_acquire);
  for (;;) {
    if ((v >> 32) != (call.generation & 0xffffffffu)) return false;
    const int64_t c = int64_t(v & 0xffffffffu);
    if (c >= call.chunks) return false;
    if (claim_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) {
      (*call.fn)(c * call.chunk, std::min(call.n, (c + 1) * call.chunk));
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard lock(mu_);
        if (callerSleeping_) done_.notify_one();
      }
      return true;
    }
  }
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
  bool wake = false;
  Call call;
  {
    std::lock_guard lock(mu_);
    call.fn = &fn;
    call.n = n;
    call.chunk = chunk;
    call.chunks = (n + chunk - 1) / chunk;
    call.generation = generation_.load() + 1;
    call_ = call;
    pending_.store(call.chunks, std::memory_order_relaxed);
    claim_.store((call.generation & 0xffffffffu) << 32, std::memory_order_release);
    generation_.store(call.generation, std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) wake_.notify_all();

  const ComputePool* const outer = tCurrentPool;  // a call made from another pool's work keeps its mark
  tCurrentPool = this;
  while (runOneChunk(call)) {
  }
  tCurrentPool = outer;
  if (!spinFor([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock lock(mu_);
    callerSleeping_ = true;
    done_.wait(lock, [this] { return pending_.load() == 0; });
    callerSleeping_ = false;
  }
}

void ComputePool::workerLoop(int) {
  tCurrentPool = this;
  // 0: a call published before this thread started is still picked up, and
  // stop_ is checked too, so a pool destroyed before its threads ran them ends.
  uint64_t seen = 0;
  for (;;) {
    auto ready = [&] { return stop_.load() || generation_.load(std::memory_order_acquire) != seen; };
    if (!spinFor(ready)) {
      std::unique_lock lock(mu_);
      ++sleepers_;
      wake_.wait(lock, ready);
      --sleepers_;
    }
    if (stop_.load()) return;
    Call call;
    {
      // The call's parameters, read under the lock that published them.
      std::lock_guard lock(mu_);
      call = call_;
      seen = call.generation;
    }
    while (runOneChunk(call)) {
    }
  }
}

}  // namespace troupe
