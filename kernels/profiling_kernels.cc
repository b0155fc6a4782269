#include "kernels/profiling_kernels.h"

#include <algorithm>
#include <chrono>

namespace troupe::kernels {

namespace {

constexpr const char* kNames[ProfilingKernels::kCount] = {
    "embeddingBagForward",   "embeddingBagBackward",   "uniqueKeys",  "dedupGradients",      "applyRowOptimizer",
    "denseForward",          "denseBackward",          "dotInteractionForward", "dotInteractionBackward",
    "reluForward",           "reluBackward",           "sigmoidCrossEntropy",   "softmaxCrossEntropy",
};

}  // namespace

ProfilingKernels::ProfilingKernels(std::shared_ptr<Kernels> inner) : inner_(std::move(inner)) {}

// The clock is read under the lock, and the summed times use the same
// readings and are added under it too: the calls' entries and exits are in
// one order, so a snapshot taken under the lock has each wall time exactly
// the union of the finished calls, never more than their sum.
std::chrono::steady_clock::time_point ProfilingKernels::enter(int id) {
  std::lock_guard lock(flightMu_);
  const auto now = std::chrono::steady_clock::now();
  for (int f : {id, int(kAny)}) {
    if (flight_[size_t(f)].depth++ == 0) flight_[size_t(f)].since = now;
  }
  return now;
}

void ProfilingKernels::leave(int id, std::chrono::steady_clock::time_point start) {
  std::lock_guard lock(flightMu_);
  const auto now = std::chrono::steady_clock::now();
  for (int f : {id, int(kAny)}) {
    Flight& flight = flight_[size_t(f)];
    if (--flight.depth == 0) {
      flight.nanos += std::chrono::duration_cast<std::chrono::nanoseconds>(now - flight.since).count();
    }
  }
  Flight& own = flight_[size_t(id)];
  ++own.calls;
  own.summedNanos += std::chrono::duration_cast<std::chrono::nanoseconds>(now - start).count();
}

template <class F>
auto ProfilingKernels::timed(Id id, F&& call) -> decltype(call()) {
  if (paused_.load(std::memory_order_relaxed) == std::this_thread::get_id()) return call();
  Stretch stretch(this, id);
  return call();
}

void ProfilingKernels::forEachIndependent(int64_t count, const std::function<void(int64_t)>& fn) {
  if (paused_.load(std::memory_order_relaxed) == std::this_thread::get_id()) {
    for (int64_t i = 0; i < count; ++i) fn(i);  // on this thread, so that its calls stay uncounted
    return;
  }
  Stretch stretch(this, kSideBySide);
  inner_->forEachIndependent(count, fn);
}

ProfilingKernels::Snapshot ProfilingKernels::snapshot() const {
  Snapshot out;
  {
    std::lock_guard lock(flightMu_);  // every figure at one moment
    // A kernel counts its finished calls (so wall <= summed); the totals
    // count their open stretch up to now too, so that a call still in flight
    // (the table actor's last push) cannot leave a kernel's wall above them.
    const auto now = std::chrono::steady_clock::now();
    auto upToNow = [&](int f) {
      const Flight& flight = flight_[size_t(f)];
      int64_t nanos = flight.nanos;
      if (flight.depth > 0) nanos += std::chrono::duration_cast<std::chrono::nanoseconds>(now - flight.since).count();
      return double(nanos) * 1e-9;
    };
    out.wall = {upToNow(kAny), flight_[kSideBySide].calls, upToNow(kSideBySide)};
    for (int i = 0; i < kCount; ++i) {
      const Flight& f = flight_[size_t(i)];
      if (f.calls == 0) continue;
      out.entries.push_back({kNames[i], f.calls, double(f.summedNanos) * 1e-9, double(f.nanos) * 1e-9});
    }
  }
  std::stable_sort(out.entries.begin(), out.entries.end(),
                   [](const Entry& a, const Entry& b) { return a.seconds > b.seconds; });
  return out;
}

Status ProfilingKernels::embeddingBagForward(const float* rows, int64_t numRows, int64_t dim,
                                             const EmbeddingBags& bags, float* out) {
  return timed(kEmbeddingBagForward, [&] { return inner_->embeddingBagForward(rows, numRows, dim, bags, out); });
}
Status ProfilingKernels::embeddingBagBackward(const float* gradOut, int64_t dim, const EmbeddingBags& bags,
                                              float* gradRows, int64_t numRows) {
  return timed(kEmbeddingBagBackward,
               [&] { return inner_->embeddingBagBackward(gradOut, dim, bags, gradRows, numRows); });
}
Expected<int64_t> ProfilingKernels::uniqueKeys(const uint64_t* keys, int64_t n, uint64_t* unique, int64_t* inverse) {
  return timed(kUniqueKeys, [&] { return inner_->uniqueKeys(keys, n, unique, inverse); });
}
Expected<int64_t> ProfilingKernels::dedupGradients(const uint64_t* keys, const float* grads, int64_t n, int64_t dim,
                                                   uint64_t* unique, float* summedGrads, int64_t* inverse) {
  return timed(kDedupGradients,
               [&] { return inner_->dedupGradients(keys, grads, n, dim, unique, summedGrads, inverse); });
}
Status ProfilingKernels::applyRowOptimizer(const OptimizerConfig& config, float* const* rows, int64_t numRows,
                                           int64_t dim, const float* grads) {
  return timed(kApplyRowOptimizer, [&] { return inner_->applyRowOptimizer(config, rows, numRows, dim, grads); });
}
Status ProfilingKernels::denseForward(const float* x, const float* w, const float* bias, int64_t batch, int64_t in,
                                      int64_t out, float* y) {
  return timed(kDenseForward, [&] { return inner_->denseForward(x, w, bias, batch, in, out, y); });
}
Status ProfilingKernels::denseBackward(const float* x, const float* w, const float* dy, int64_t batch, int64_t in,
                                       int64_t out, float* dx, float* dw, float* dbias, bool accumulate) {
  return timed(kDenseBackward,
               [&] { return inner_->denseBackward(x, w, dy, batch, in, out, dx, dw, dbias, accumulate); });
}
Status ProfilingKernels::dotInteractionForward(const float* const* inputs, int64_t numInputs, int64_t batch,
                                               int64_t dim, float* out, int64_t outStride) {
  return timed(kDotInteractionForward,
               [&] { return inner_->dotInteractionForward(inputs, numInputs, batch, dim, out, outStride); });
}
Status ProfilingKernels::dotInteractionBackward(const float* const* inputs, int64_t numInputs, int64_t batch,
                                                int64_t dim, const float* dOut, int64_t dOutStride,
                                                float* const* dInputs) {
  return timed(kDotInteractionBackward, [&] {
    return inner_->dotInteractionBackward(inputs, numInputs, batch, dim, dOut, dOutStride, dInputs);
  });
}
void ProfilingKernels::reluForward(const float* x, int64_t n, float* y) {
  timed(kReluForward, [&] { inner_->reluForward(x, n, y); });
}
void ProfilingKernels::reluBackward(const float* x, const float* dy, int64_t n, float* dx) {
  timed(kReluBackward, [&] { inner_->reluBackward(x, dy, n, dx); });
}
Expected<double> ProfilingKernels::sigmoidCrossEntropy(const float* logits, const float* labels, int64_t n,
                                                       float* dLogits) {
  return timed(kSigmoidCrossEntropy, [&] { return inner_->sigmoidCrossEntropy(logits, labels, n, dLogits); });
}
Expected<double> ProfilingKernels::softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t batch,
                                                       int64_t classes, float* dLogits) {
  return timed(kSoftmaxCrossEntropy,
               [&] { return inner_->softmaxCrossEntropy(logits, labels, batch, classes, dLogits); });
}

}  // namespace troupe::kernels
