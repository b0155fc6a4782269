// DlrmModel: the dense part of a DLRM-style recommendation model (Naumov et
// al. 2019). Embedding look-ups are not here: the worker pulls rows from the
// tables (ps/), pools them with the embedding-bag kernel and hands the pooled
// vectors in; backward hands their gradients back.
//
//   dense [B x numDense] -> bottom MLP (ReLU after every layer) -> x [B x dim]
//   Z = {x, e_1, ..., e_T}                       (T pooled embeddings [B x dim])
//   top input = [x | <z_i, z_j> for i > j]       (dim + F(F-1)/2 wide, F = T + 1)
//               [ | e_1 | ... | e_T]             (with concatEmbeddings: T x dim more)
//   top MLP (ReLU between layers) -> logit [B]
//
// Every dense weight lives in one DenseParameters buffer (bottom MLP, then top).
// Threading: one owner.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"
#include "kernels/row_optimizer.h"
#include "workers/dense_parameters.h"
#include "workers/mlp.h"

namespace troupe::workers {

struct DlrmShape {
  int64_t numDense = 13;
  int numTables = 26;
  int64_t embeddingDim = 16;
  std::vector<int64_t> bottom = {64, 16};  // hidden widths; the last must equal embeddingDim
  std::vector<int64_t> top = {128, 64};    // hidden widths; a final width of 1 is added
  // Also feed the pooled embeddings themselves to the top MLP (first-order
  // terms of each value, as in Wide & Deep / DeepFM), after the pairs.
  bool concatEmbeddings = false;
};

// The DLRM above its bottom MLP, over a slice of `params` from `offset`:
// the pairwise dot interaction of Z = {x, e_1, ..., e_T} (and the pooled
// embeddings themselves with concatEmbeddings), then the top MLP down to
// one logit. DlrmModel's upper half, and a pipeline's last stage
// (workers/pipeline_stage.h).
class DlrmTop final {
 public:
  // The top MLP's widths: {interaction width, top..., 1}.
  static std::vector<int64_t> widths(const DlrmShape& shape);
  DlrmTop(const DlrmShape& shape, DenseParameters* params, int64_t offset);

  Mlp& mlp() { return *mlp_; }
  int64_t interactionWidth() const { return inWidth_; }
  // x [batch x dim]; embeddings: numTables pointers to [batch x dim]; both
  // kept until backward. The logits: logits() [batch].
  Status forward(kernels::Kernels& k, const float* x, const float* const* embeddings, int64_t batch);
  const float* logits() const { return mlp_->output(); }
  // dLogits [batch] -> dX [batch x dim] and dEmbeddings (numTables
  // pointers to [batch x dim]), overwritten; the weights' gradients
  // overwritten, or added to with `accumulate`.
  Status backward(kernels::Kernels& k, const float* dLogits, float* dX, float* const* dEmbeddings,
                  bool accumulate = false);
  // What a forward keeps for its backward (a pipeline stage holds one per
  // micro-batch in flight).
  struct Activations {
    Mlp::Activations mlp;
    std::vector<const float*> z;
    std::vector<float> topIn;
    int64_t batch = 0;
  };
  Activations takeActivations();
  void restoreActivations(Activations&& a);

 private:
  DlrmShape shape_;
  std::unique_ptr<Mlp> mlp_;
  int64_t inWidth_;
  int64_t batch_ = 0;
  std::vector<const float*> z_;  // {x, e_1..e_T} of the last forward
  std::vector<float> topIn_, dTopIn_, dInteractionX_;
  std::vector<float*> dZ_;
};

class DlrmModel final {
 public:
  // Throws SetupError on an inconsistent shape.
  DlrmModel(const DlrmShape& shape, const kernels::OptimizerConfig& denseOptimizer, uint64_t seed);

  const DlrmShape& shape() const { return shape_; }
  DenseParameters& parameters() { return params_; }
  // Width of the top MLP's input.
  int64_t interactionWidth() const { return top_->interactionWidth(); }
  // The bottom MLP's widths: {numDense, bottom...}.
  static std::vector<int64_t> bottomWidths(const DlrmShape& shape);
  // Multiply-adds per sample in the dense layers and the interaction.
  int64_t macsPerSample() const;

  // dense [batch x numDense]; embeddings: numTables pointers to [batch x dim].
  // Writes logits [batch]. Inputs must stay valid until backward returns.
  Status forward(kernels::Kernels& k, const float* dense, const float* const* embeddings, int64_t batch,
                 float* logits);

  // dLogits [batch]; writes the dense gradients into parameters().grads() and
  // the embeddings' gradients into dEmbeddings (numTables pointers to
  // [batch x dim], overwritten).
  Status backward(kernels::Kernels& k, const float* dLogits, float* const* dEmbeddings);
  // See Mlp::setGradReady / gradientOrder: the top MLP's layers, then the bottom's.
  void setGradReady(const std::function<void(int64_t, int64_t)>& hook);
  std::vector<std::pair<int64_t, int64_t>> gradientOrder() const;

 private:
  DlrmShape shape_;
  DenseParameters params_;
  std::unique_ptr<Mlp> bottom_;
  std::unique_ptr<DlrmTop> top_;
  int64_t batch_ = 0;
  std::vector<float> dX_;
};

}  // namespace troupe::workers
