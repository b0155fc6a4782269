#include "kernels/cpu/interaction.h"

#include <algorithm>
#include <vector>

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

// Sixteen floats, one AVX-512 register (two AVX2 ones elsewhere): the fast
// paths below are written on it so the compiler cannot pick another loop to
// vectorise (left alone, it gathered across inputs instead of streaming a row).
typedef float V16 __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

inline V16 load16(const float* p) {
  V16 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store16(float* p, V16 v) { __builtin_memcpy(p, &v, sizeof v); }

// One sample, dim a multiple of 16. zt holds Z transposed and padded,
// zt[d][0 .. chunks * 16), so the dots of input i with every j are a few
// vector FMAs per d; sums run over d in order. kChunks > 0: the chunk count
// is known, so the accumulators are locals the compiler keeps in registers
// (in an array behind a pointer each FMA waited for the store of the one
// before it: about 5x slower); 0: any count, in `acc`.
template <int kChunks>
void forwardSample16(const float* const* inputs, int64_t f, int64_t b, int64_t dim, float* o, float* zt, V16* acc) {
  const int64_t chunks = (f + kLanes - 1) / kLanes, width = chunks * kLanes;
  for (int64_t j = 0; j < f; ++j) {
    const float* z = inputs[j] + b * dim;
    for (int64_t d = 0; d < dim; ++d) zt[d * width + j] = z[d];
  }
  if constexpr (kChunks > 0) {
    // Four inputs i at a time: four chains of FMAs in flight instead of one
    // waiting on the last (each sum still runs over d in order).
    constexpr int64_t kRows = 4;
    for (int64_t i0 = 1; i0 < f; i0 += kRows) {
      const int64_t rows = std::min(kRows, f - i0);
      V16 r[kRows][kChunks] = {};
      for (int64_t d = 0; d < dim; ++d) {
        const float* row = zt + d * width;
        for (int64_t k = 0; k < kRows; ++k) {
          const float zi = row[i0 + k];  // (past f: a padded zero, or the next d's row; unused)
          for (int64_t c = 0; c < kChunks; ++c) r[k][c] += zi * load16(row + c * kLanes);
        }
      }
      for (int64_t k = 0; k < rows; ++k) {
        for (int64_t j = 0; j < i0 + k; ++j) *o++ = r[k][j / kLanes][j % kLanes];
      }
    }
    return;
  }
  for (int64_t i = 1; i < f; ++i) {
    const int64_t used = (i + kLanes - 1) / kLanes;  // chunks holding j < i
    for (int64_t c = 0; c < used; ++c) acc[c] = V16{};
    for (int64_t d = 0; d < dim; ++d) {
      const float* row = zt + d * width;
      const float zi = row[i];
      for (int64_t c = 0; c < used; ++c) acc[c] += zi * load16(row + c * kLanes);
    }
    const float* a = reinterpret_cast<const float*>(acc);
    for (int64_t j = 0; j < i; ++j) *o++ = a[j];
  }
}

// One sample, dim a multiple of 16: dz_i = sum over j != i of g(i, j) z_j,
// j in order. kVecs = dim / 16 when known (the accumulators in registers,
// as above), 0 for any dim (in `acc`).
template <int kVecs>
void backwardSample16(const float* const* inputs, int64_t f, int64_t b, int64_t dim, const float* go,
                      float* const* dInputs, float* g, V16* acc) {
  const int64_t vecs = dim / kLanes;
  for (int64_t i = 1, p = 0; i < f; ++i) {
    for (int64_t j = 0; j < i; ++j, ++p) g[i * f + j] = g[j * f + i] = go[p];
  }
  for (int64_t i = 0; i < f; ++i) {
    float* out = dInputs[i] + b * dim;
    if constexpr (kVecs > 0) {
      V16 r[kVecs] = {};
      for (int64_t j = 0; j < f; ++j) {
        if (j == i) continue;
        const float gij = g[i * f + j];
        const float* z = inputs[j] + b * dim;
        for (int64_t v = 0; v < kVecs; ++v) r[v] += gij * load16(z + v * kLanes);
      }
      for (int64_t v = 0; v < kVecs; ++v) store16(out + v * kLanes, r[v]);
    } else {
      for (int64_t v = 0; v < vecs; ++v) acc[v] = V16{};
      for (int64_t j = 0; j < f; ++j) {
        if (j == i) continue;
        const float gij = g[i * f + j];
        const float* z = inputs[j] + b * dim;
        for (int64_t v = 0; v < vecs; ++v) acc[v] += gij * load16(z + v * kLanes);
      }
      for (int64_t v = 0; v < vecs; ++v) store16(out + v * kLanes, acc[v]);
    }
  }
}

// Any dim: the plain loops.
void forwardSample(const float* const* inputs, int64_t f, int64_t b, int64_t dim, float* o) {
  for (int64_t i = 1; i < f; ++i) {
    const float* zi = inputs[i] + b * dim;
    for (int64_t j = 0; j < i; ++j) {
      const float* zj = inputs[j] + b * dim;
      float acc = 0.0f;
      for (int64_t d = 0; d < dim; ++d) acc += zi[d] * zj[d];
      *o++ = acc;
    }
  }
}

void backwardSample(const float* const* inputs, int64_t f, int64_t b, int64_t dim, const float* go,
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
        gi[d] += go[p] * zj[d];
        gj[d] += go[p] * zi[d];
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
  pool.parallelFor(batch, 16, [&](int64_t b0, int64_t b1) {
    if (dim % kLanes != 0) {
      for (int64_t b = b0; b < b1; ++b) forwardSample(inputs, f, b, dim, out + b * outStride);
      return;
    }
    const int64_t chunks = (f + kLanes - 1) / kLanes;
    // (+ 4: forwardSample16 reads up to 3 past the last input of the last row.)
    std::vector<float> zt(static_cast<size_t>(dim * chunks * kLanes + 4), 0.0f);
    std::vector<V16> acc(static_cast<size_t>(chunks));
    auto run = [&](auto sample) {
      for (int64_t b = b0; b < b1; ++b) sample(inputs, f, b, dim, out + b * outStride, zt.data(), acc.data());
    };
    switch (chunks) {
      case 1: return run(forwardSample16<1>);
      case 2: return run(forwardSample16<2>);
      case 3: return run(forwardSample16<3>);
      case 4: return run(forwardSample16<4>);
      default: return run(forwardSample16<0>);
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
    if (dim % kLanes != 0) {
      for (int64_t b = b0; b < b1; ++b) backwardSample(inputs, f, b, dim, dOut + b * dOutStride, dInputs);
      return;
    }
    std::vector<float> g(static_cast<size_t>(f * f), 0.0f);
    std::vector<V16> acc(static_cast<size_t>(dim / kLanes));
    auto run = [&](auto sample) {
      for (int64_t b = b0; b < b1; ++b) sample(inputs, f, b, dim, dOut + b * dOutStride, dInputs, g.data(), acc.data());
    };
    switch (dim / kLanes) {
      case 1: return run(backwardSample16<1>);
      case 2: return run(backwardSample16<2>);
      case 3: return run(backwardSample16<3>);
      case 4: return run(backwardSample16<4>);
      default: return run(backwardSample16<0>);
    }
  });
  return Status::ok();
}

}  // namespace troupe::kernels::cpu
