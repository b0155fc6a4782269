// Mlp: a stack of fully connected layers with ReLU between them, over slices
// of a DenseParameters buffer.
//
// widths = {in, h1, ..., out}: layer l maps widths[l] -> widths[l+1]. Every
// layer but the last is followed by ReLU; reluOnOutput adds one after the last
// too (a DLRM bottom MLP). Parameters of layer l: W [out x in] then b [out],
// layers one after another from `offset` in the buffer.
//
// forward keeps each layer's output for backward; the input pointer must stay
// valid until backward returns. backward overwrites this MLP's slice of the
// gradient buffer, or adds to it (micro-batches). Threading: one owner.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "common/status.h"

namespace troupe::kernels {
class Kernels;
}

namespace troupe::workers {

class DenseParameters;

class Mlp final {
 public:
  // Weights of an MLP with these widths.
  static int64_t parameterCount(const std::vector<int64_t>& widths);

  // Throws SetupError on fewer than two widths or a width < 1.
  Mlp(std::vector<int64_t> widths, bool reluOnOutput, DenseParameters* params, int64_t offset);

  // PyTorch's nn.Linear initialisation: W and b uniform in +-1/sqrt(in), from
  // Rng(hash(seed, layer)).
  void initialize(uint64_t seed);

  Status forward(kernels::Kernels& k, const float* x, int64_t batch);
  // The last forward's output, [batch x widths.back()].
  const float* output() const { return outputs_.back().data(); }
  float* mutableOutput() { return outputs_.back().data(); }

  // dOut: gradient of the output [batch x out]. dx: gradient of the input
  // [batch x in] (overwritten), or nullptr when not needed. The weights'
  // gradients are overwritten, or added to with `accumulate` (micro-batches).
  Status backward(kernels::Kernels& k, const float* dOut, float* dx, bool accumulate = false);

  // What a forward keeps for its backward (the input pointer, the batch and
  // each layer's output), taken out and put back: a pipeline stage holds
  // one per micro-batch in flight (workers/pipeline_stage.h).
  struct Activations {
    const float* input = nullptr;
    int64_t batch = 0;
    std::vector<std::vector<float>> outputs;
  };
  Activations takeActivations();
  void restoreActivations(Activations&& a);

  // Called during backward as each layer's gradients (W and b, adjacent in
  // the buffer) are final: (offset, count) in the parameter buffer. Lets
  // gradient buckets start reducing while backward goes on.
  void setGradReady(std::function<void(int64_t offset, int64_t count)> hook) { gradReady_ = std::move(hook); }
  // The (offset, count) of each layer in the order backward finishes them.
  std::vector<std::pair<int64_t, int64_t>> gradientOrder() const;

  const std::vector<int64_t>& widths() const { return widths_; }
  int64_t inputWidth() const { return widths_.front(); }
  int64_t outputWidth() const { return widths_.back(); }
  // Multiply-adds of one forward pass per sample (sum of in x out).
  int64_t macsPerSample() const;

 private:
  float* weight(size_t layer);
  float* bias(size_t layer);
  float* weightGrad(size_t layer);
  float* biasGrad(size_t layer);
  bool reluAfter(size_t layer) const { return layer + 1 < widths_.size() - 1 || reluOnOutput_; }

  std::vector<int64_t> widths_;
  bool reluOnOutput_;
  DenseParameters* params_;
  std::vector<int64_t> offsets_;  // start of each layer's W in the buffer
  const float* input_ = nullptr;
  int64_t batch_ = 0;
  std::vector<std::vector<float>> outputs_;
  std::vector<float> gradA_, gradB_;
  std::function<void(int64_t, int64_t)> gradReady_;
};

}  // namespace troupe::workers
