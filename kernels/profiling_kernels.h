// Kernels that time every call of the kernels they wrap: where a step's
// compute goes (`train.profile`; bench/step_profile.sh turns it into the
// per-phase profile and the scaling Amdahl's law predicts from it).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/kernels.h"

namespace troupe::kernels {

class ProfilingKernels final : public Kernels {
 public:
  explicit ProfilingKernels(std::shared_ptr<Kernels> inner);

  struct Entry {
    std::string kernel;  // the Kernels method: "denseForward", ...
    int64_t calls = 0;
    // Wall time inside the calls, summed: calls on two threads at once both
    // count, and so does a wait for the wrapped kernels' threads (in
    // cpu::Kernels the calls that use its pool take turns for it).
    double seconds = 0;
    // Wall time with at least one of its calls in flight on any thread:
    // calls side by side count once, so on many threads this, not `seconds`,
    // is the kernel's share of a step.
    double wallSeconds = 0;
  };
  struct Wall {
    // Wall time with any kernel call or forEachIndependent in flight on any
    // thread: training time less this is outside every kernel and every
    // forEachIndependent (the step's own code, the messages, the waits).
    double kernelSeconds = 0;
    // forEachIndependent: its calls and the wall time inside them (the
    // per-table pieces; their kernels' calls are counted under their names).
    int64_t sideBySideCalls = 0;
    double sideBySideSeconds = 0;
  };
  // Every figure so far, taken at one moment: the kernels called, by summed
  // time, largest first, and the wall totals.
  struct Snapshot {
    std::vector<Entry> entries;
    Wall wall;
  };
  Snapshot snapshot() const;
  std::vector<Entry> profile() const { return snapshot().entries; }
  Wall wall() const { return snapshot().wall; }
  // Calls made on the calling thread from now on are not counted (its
  // evaluations), until it calls this again with false; other threads'
  // calls (the table actor's work on a push still in flight) still are.
  void pauseThisThread(bool paused) {
    paused_.store(paused ? std::this_thread::get_id() : std::thread::id(), std::memory_order_relaxed);
  }

  Device device() const override { return inner_->device(); }
  int threads() const override { return inner_->threads(); }
  // Timed as a whole (Wall::sideBySide*), and the calls its pieces make are
  // too, on whichever thread runs them (so their summed times add up across
  // threads). From a paused thread the pieces run in order on it, and
  // neither the whole nor its calls are counted.
  void forEachIndependent(int64_t count, const std::function<void(int64_t)>& fn) override;
  Status embeddingBagForward(const float* rows, int64_t numRows, int64_t dim, const EmbeddingBags& bags,
                             float* out) override;
  Status embeddingBagBackward(const float* gradOut, int64_t dim, const EmbeddingBags& bags, float* gradRows,
                              int64_t numRows) override;
  Expected<int64_t> uniqueKeys(const uint64_t* keys, int64_t n, uint64_t* uniqueKeys, int64_t* inverse) override;
  Expected<int64_t> dedupGradients(const uint64_t* keys, const float* grads, int64_t n, int64_t dim,
                                   uint64_t* uniqueKeys, float* summedGrads, int64_t* inverse) override;
  Status applyRowOptimizer(const OptimizerConfig& config, float* const* rows, int64_t numRows, int64_t dim,
                           const float* grads) override;
  Status denseForward(const float* x, const float* w, const float* bias, int64_t batch, int64_t in, int64_t out,
                      float* y) override;
  Status denseBackward(const float* x, const float* w, const float* dy, int64_t batch, int64_t in, int64_t out,
                       float* dx, float* dw, float* dbias, bool accumulate) override;
  Status dotInteractionForward(const float* const* inputs, int64_t numInputs, int64_t batch, int64_t dim, float* out,
                               int64_t outStride) override;
  Status dotInteractionBackward(const float* const* inputs, int64_t numInputs, int64_t batch, int64_t dim,
                                const float* dOut, int64_t dOutStride, float* const* dInputs) override;
  void reluForward(const float* x, int64_t n, float* y) override;
  void reluBackward(const float* x, const float* dy, int64_t n, float* dx) override;
  Expected<double> sigmoidCrossEntropy(const float* logits, const float* labels, int64_t n,
                                       float* dLogits) override;
  Expected<double> softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch, int64_t classes,
                                       float* dLogits) override;

  enum Id : int {
    kEmbeddingBagForward,
    kEmbeddingBagBackward,
    kUniqueKeys,
    kDedupGradients,
    kApplyRowOptimizer,
    kDenseForward,
    kDenseBackward,
    kDotInteractionForward,
    kDotInteractionBackward,
    kReluForward,
    kReluBackward,
    kSigmoidCrossEntropy,
    kSoftmaxCrossEntropy,
    kCount
  };

 private:
  template <class F>
  auto timed(Id id, F&& call) -> decltype(call());
  // Wall-time bookkeeping: a call enters and leaves its kernel's flight and
  // the any-kernel flight (kAny); forEachIndependent its own (kSideBySide).
  static constexpr int kSideBySide = kCount;
  static constexpr int kAny = kCount + 1;
  std::chrono::steady_clock::time_point enter(int id);
  void leave(int id, std::chrono::steady_clock::time_point start);
  // One call (or forEachIndependent) in flight: entered when made, left
  // when it goes, however the call ends.
  struct Stretch {
    Stretch(ProfilingKernels* self, int id) : self(self), id(id), start(self->enter(id)) {}
    ~Stretch() { self->leave(id, start); }
    Stretch(const Stretch&) = delete;
    Stretch& operator=(const Stretch&) = delete;
    ProfilingKernels* self;
    int id;
    std::chrono::steady_clock::time_point start;
  };
  struct Flight {
    int depth = 0;
    std::chrono::steady_clock::time_point since{};
    int64_t nanos = 0;         // wall: the union of the calls' stretches
    int64_t calls = 0;         // finished calls
    int64_t summedNanos = 0;   // the calls' stretches added up
  };

  std::shared_ptr<Kernels> inner_;
  std::atomic<std::thread::id> paused_{};
  mutable std::mutex flightMu_;  // guards flight_ (held for the bookkeeping only)
  std::array<Flight, kCount + 2> flight_{};
};

}  // namespace troupe::kernels
