#include "kernels/cpu/interaction.h"

#include <algorithm>
#include <vector>

#if defined(__FMA__) || defined(__AVX512F__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "common/check.h"

namespace troupe::kernels::cpu {
namespace {

Status checkShape(int64_t numInputs, int64_t batch, int64_t dim, int64_t stride, const char* what) {
  if (numInputs < 0 || batch < 0 || dim < 0) {
    return Status::invalidArgument(
        fmt::format("dot interaction: negative size ({} inputs, batch {}, dim {})", numInputs, batch, dim));
  }
  const int64_t pairs = numInputs * (numInputs - 1) / 2;
  if (batch > 0 && stride < pairs) {
    return Status::invalidArgument(fmt::format("dot interaction: {} stride {} < {} pairs", what, stride, pairs));
  }
  return Status::ok();
}

// One vector register of floats: 16 with AVX-512, 8 with AVX or AVX2, 4
// otherwise. The fast paths below are written on it so the compiler cannot
// pick another loop to vectorise (left alone, it gathered across inputs
// instead of streaming a row). A vector wider than the machine's registers
// is split by GCC late and kept on the stack: on an AVX2 host the 16-float
// version ran 13-24x slower than this.
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#elif defined(__AVX__)
constexpr int64_t kLanes = 8;
#else
constexpr int64_t kLanes = 4;
#endif
typedef float V __attribute__((vector_size(kLanes * sizeof(float))));
// Accumulators a fast path keeps in registers (of 16 with SSE, AVX or AVX2,
// 32 with AVX-512 or on aarch64): the rest hold the loads and the broadcast.
constexpr int64_t kAccumulators = 8;
// Rows the fast paths may compute past the last input (their results unused).
constexpr int64_t kPadRows = kAccumulators;

// Every sum of the interaction is a chain of multiply-adds, each rounded
// once where the machine fuses (x86 with FMA or AVX-512, aarch64) and twice
// elsewhere, whatever the compiler's optimisation level: written out here,
// and the file is built with -ffp-contract=off so no other expression is
// fused.
#if defined(__FMA__) || defined(__AVX512F__) || defined(__aarch64__)
#define TROUPE_INTERACTION_FUSED 1
#endif

inline float fusedOrNot(float a, float b, float acc) {
#if defined(TROUPE_INTERACTION_FUSED)
  return __builtin_fmaf(a, b, acc);
#else
  return acc + a * b;
#endif
}

// acc + a * b, lane by lane, rounded as fusedOrNot.
inline V fusedOrNot(float a, V b, V acc) {
#if defined(TROUPE_INTERACTION_FUSED) && defined(__aarch64__)
  return (V)vfmaq_f32((float32x4_t)acc, vdupq_n_f32(a), (float32x4_t)b);
#elif defined(TROUPE_INTERACTION_FUSED) && defined(__AVX512F__)
  return (V)_mm512_fmadd_ps(_mm512_set1_ps(a), (__m512)b, (__m512)acc);
#elif defined(TROUPE_INTERACTION_FUSED) && defined(__AVX__)
  return (V)_mm256_fmadd_ps(_mm256_set1_ps(a), (__m256)b, (__m256)acc);
#elif defined(TROUPE_INTERACTION_FUSED)
  return (V)_mm_fmadd_ps(_mm_set1_ps(a), (__m128)b, (__m128)acc);
#else
  return acc + a * b;
#endif
}

inline V loadV(const float* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void storeV(float* p, V v) { __builtin_memcpy(p, &v, sizeof v); }

// One sample, dim a multiple of kLanes. zt holds Z transposed and padded,
// zt[d][0 .. kChunks * kLanes + kPadRows), so the dots of input i with every
// j are a few vector multiply-adds per d; each sum runs over d in order.
// kRows inputs i at a time: kRows * kChunks chains in flight, their
// accumulators locals the compiler keeps in registers (in an array behind a
// pointer each step waited for the store of the one before it: about 5x
// slower).
template <int kChunks>
void forwardSample(const float* const* inputs, int64_t f, int64_t b, int64_t dim, float* o, float* zt) {
  constexpr int64_t kRows = std::max<int64_t>(1, kAccumulators / kChunks);
  constexpr int64_t width = kChunks * kLanes + kPadRows;
  for (int64_t j = 0; j < f; ++j) {
    const float* z = inputs[j] + b * dim;
    for (int64_t d = 0; d < dim; ++d) zt[d * width + j] = z[d];
  }
  alignas(64) float sums[kRows][kChunks * kLanes];
  for (int64_t i0 = 1; i0 < f; i0 += kRows) {
    const int64_t rows = std::min(kRows, f - i0);
    V r[kRows][kChunks] = {};
    for (int64_t d = 0; d < dim; ++d) {
      const float* row = zt + d * width;
      for (int64_t k = 0; k < kRows; ++k) {
        const float zi = row[i0 + k];  // (past f: padding; unused)
        for (int64_t c = 0; c < kChunks; ++c) r[k][c] = fusedOrNot(zi, loadV(row + c * kLanes), r[k][c]);
      }
    }
    for (int64_t k = 0; k < kRows; ++k) {
      for (int64_t c = 0; c < kChunks; ++c) storeV(&sums[k][c * kLanes], r[k][c]);
    }
    for (int64_t k = 0; k < rows; ++k) {
      for (int64_t j = 0; j < i0 + k; ++j) *o++ = sums[k][j];
    }
  }
}

// dz_i = sum over j != i of g(i, j) z_j, j in order, for one sample and the
// kVecs * kLanes dims from d0 (dim a multiple of kLanes; a wider row is done
// in blocks, each element's sum the same). kRows inputs i at a time share
// each load of z_j. g is the sample's f x f symmetric gradient with
// kPadRows more rows of zeros (symmetricGradient).
template <int kVecs>
void backwardBlock(const float* const* inputs, int64_t f, int64_t b, int64_t dim, int64_t d0, const float* g,
                   float* const* dInputs) {
  constexpr int64_t kRows = std::max<int64_t>(1, kAccumulators / kVecs);
  for (int64_t i0 = 0; i0 < f; i0 += kRows) {
    const int64_t rows = std::min(kRows, f - i0);
    V r[kRows][kVecs] = {};
    for (int64_t j = 0; j < f; ++j) {
      const float* z = inputs[j] + b * dim + d0;
      V zj[kVecs];
      for (int64_t v = 0; v < kVecs; ++v) zj[v] = loadV(z + v * kLanes);
      for (int64_t k = 0; k < kRows; ++k) {
        if (j == i0 + k) continue;
        const float gij = g[(i0 + k) * f + j];
        for (int64_t v = 0; v < kVecs; ++v) r[k][v] = fusedOrNot(gij, zj[v], r[k][v]);
      }
    }
    for (int64_t k = 0; k < rows; ++k) {
      float* out = dInputs[i0 + k] + b * dim + d0;
      for (int64_t v = 0; v < kVecs; ++v) storeV(out + v * kLanes, r[k][v]);
    }
  }
}

// g(i, j) = g(j, i) = go[pair (i, j)], the forward's pair order.
void symmetricGradient(int64_t f, const float* go, float* g) {
  for (int64_t i = 1, p = 0; i < f; ++i) {
    for (int64_t j = 0; j < i; ++j, ++p) g[i * f + j] = g[j * f + i] = go[p];
  }
}

// One sample, dim a multiple of kLanes: in blocks of up to 8 vectors.
void backwardSample(const float* const* inputs, int64_t f, int64_t b, int64_t dim, const float* go,
                    float* const* dInputs, float* g) {
  symmetricGradient(f, go, g);
  constexpr int64_t kBlock = 8;
  for (int64_t d0 = 0; d0 < dim; d0 += kBlock * kLanes) {
    switch (std::min(kBlock, (dim - d0) / kLanes)) {
      case 1: backwardBlock<1>(inputs, f, b, dim, d0, g, dInputs); break;
      case 2: backwardBlock<2>(inputs, f, b, dim, d0, g, dInputs); break;
      case 3: backwardBlock<3>(inputs, f, b, dim, d0, g, dInputs); break;
      case 4: backwardBlock<4>(inputs, f, b, dim, d0, g, dInputs); break;
      case 5: backwardBlock<5>(inputs, f, b, dim, d0, g, dInputs); break;
      case 6: backwardBlock<6>(inputs, f, b, dim, d0, g, dInputs); break;
      case 7: backwardBlock<7>(inputs, f, b, dim, d0, g, dInputs); break;
      default: backwardBlock<8>(inputs, f, b, dim, d0, g, dInputs); break;
    }
  }
}

// Any dim: the plain loops. (Left to itself GCC vectorised the forward's
// loop into products rounded apart from their sums, vmulps then vaddss, and
// fused only its tail: hence fusedOrNot everywhere.)
void forwardSamplePlain(const float* const* inputs, int64_t f, int64_t b, int64_t dim, float* o) {
  for (int64_t i = 1; i < f; ++i) {
    const float* zi = inputs[i] + b * dim;
    for (int64_t j = 0; j < i; ++j) {
      const float* zj = inputs[j] + b * dim;
      float acc = 0.0f;
      for (int64_t d = 0; d < dim; ++d) acc = fusedOrNot(zi[d], zj[d], acc);
      *o++ = acc;
    }
  }
}

void backwardSamplePlain(const float* const* inputs, int64_t f, int64_t b, int64_t dim, const float* go,
                         float* const* dInputs) {
  for (int64_t i = 0; i < f; ++i) {
    float* out = dInputs[i] + b * dim;
    for (int64_t d = 0; d < dim; ++d) out[d] = 0.0f;
  }
  for (int64_t i = 1, p = 0; i < f; ++i) {
    const float* zi = inputs[i] + b * dim;
    float* gi = dInputs[i] + b * dim;
    for (int64_t j = 0; j < i; ++j, ++p) {
      const float* zj = inputs[j] + b * dim;
      float* gj = dInputs[j] + b * dim;
      for (int64_t d = 0; d < dim; ++d) {
        gi[d] = fusedOrNot(go[p], zj[d], gi[d]);
        gj[d] = fusedOrNot(go[p], zi[d], gj[d]);
      }
    }
  }
}

}  // namespace

Status dotInteractionForward(ComputePool& pool, const float* const* inputs, int64_t numInputs, int64_t batch,
                             int64_t dim, float* out, int64_t outStride) {
  Status s = checkShape(numInputs, batch, dim, outStride, "output");
  if (!s.isOk() || batch == 0 || numInputs < 2) return s;
  TROUPE_CHECK(inputs != nullptr && out != nullptr, "dot interaction: null pointer");
  const int64_t f = numInputs;
  const int64_t chunks = (f + kLanes - 1) / kLanes;
  pool.parallelFor(batch, 16, [&](int64_t b0, int64_t b1) {
    auto plain = [&] {
      for (int64_t b = b0; b < b1; ++b) forwardSamplePlain(inputs, f, b, dim, out + b * outStride);
    };
    if (dim % kLanes != 0 || chunks > 8) return plain();
    std::vector<float> zt(static_cast<size_t>(dim * (chunks * kLanes + kPadRows)), 0.0f);
    auto run = [&](auto sample) {
      for (int64_t b = b0; b < b1; ++b) sample(inputs, f, b, dim, out + b * outStride, zt.data());
    };
    switch (chunks) {
      case 1: return run(forwardSample<1>);
      case 2: return run(forwardSample<2>);
      case 3: return run(forwardSample<3>);
      case 4: return run(forwardSample<4>);
      case 5: return run(forwardSample<5>);
      case 6: return run(forwardSample<6>);
      case 7: return run(forwardSample<7>);
      default: return run(forwardSample<8>);
    }
  });
  return Status::ok();
}

Status dotInteractionBackward(ComputePool& pool, const float* const* inputs, int64_t numInputs, int64_t batch,
                              int64_t dim, const float* dOut, int64_t dOutStride, float* const* dInputs) {
  Status s = checkShape(numInputs, batch, dim, dOutStride, "gradient");
  if (!s.isOk() || batch == 0) return s;
  TROUPE_CHECK(inputs != nullptr && dInputs != nullptr, "dot interaction: null pointer");
  const int64_t f = numInputs;
  pool.parallelFor(batch, 16, [&](int64_t b0, int64_t b1) {
    if (dim % kLanes != 0 || dim == 0) {
      for (int64_t b = b0; b < b1; ++b) backwardSamplePlain(inputs, f, b, dim, dOut + b * dOutStride, dInputs);
      return;
    }
    std::vector<float> g(static_cast<size_t>((f + kPadRows) * f), 0.0f);
    for (int64_t b = b0; b < b1; ++b) backwardSample(inputs, f, b, dim, dOut + b * dOutStride, dInputs, g.data());
  });
  return Status::ok();
}

}  // namespace troupe::kernels::cpu
