#include "kernels/cpu/codecs.h"

#include <algorithm>
#include <functional>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#endif

#include "common/check.h"
#include "common/hash.h"
#include "kernels/codec_format.h"

namespace troupe::kernels::cpu {
namespace {

using format::Header;

// A value that is not a finite float (NaN or infinite) makes the whole
// encoding fail: a gradient like that is a bug upstream, not data.
// (An integer test of the exponent, so that the loops vectorise: a loop
// takes the largest exponent field it saw, and all ones means inf or NaN.)
constexpr uint32_t kExponent = 0x7f800000u;
inline bool notFinite(float v) { return (std::bit_cast<uint32_t>(v) & kExponent) == kExponent; }
inline float clampTo(float v, float m) {
  const float c = v > m ? m : v;
  return c < -m ? -m : c;
}

Status notFiniteAt(const float* values, const float* residual, int64_t n, const char* codec) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = values[i] + (residual ? residual[i] : 0.0f);
    if (notFinite(v)) {
      return Status::invalidArgument(fmt::format("{}: value {} of {} to encode is not finite ({})", codec, i, n, v));
    }
  }
  return Status::internal(fmt::format("{}: a value to encode is not finite", codec));
}

// What each codec shares: the header, written and checked.
class CodecBase : public Codec {
 public:
  explicit CodecBase(const CodecOptions& o) : o_(o) {}
  CodecKind kind() const override { return o_.kind; }
  size_t encodedBytes(int64_t n) const override { return kCodecHeaderBytes + format::payloadBytes(o_, n); }

 protected:
  std::byte* start(std::vector<std::byte>* out, int64_t n, uint64_t step) const {
    return format::start(o_, out, n, step);
  }
  Status check(const std::byte* data, size_t bytes, int64_t n, Header* h) const {
    return format::check(o_, data, bytes, n, h);
  }
  int64_t chunks(int64_t n) const { return format::chunks(o_, n); }
  int64_t sparseK(int64_t n) const { return format::sparseK(o_, n); }

  const CodecOptions o_;
};

// ------------------------------------------------------------------ casts

inline uint16_t toBf16(float v) {
  uint32_t u = std::bit_cast<uint32_t>(v);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (finite values only)
  return uint16_t(u >> 16);
}
inline float fromBf16(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

constexpr float kHalfMax = 65504.0f;
constexpr float kBf16Max = 3.38953139e38f;  // the largest finite bf16

// fp16 and bf16: one 16-bit value each. A value beyond the type's range
// is clamped to its largest (the residual keeps the rest).
template <bool kBf16>
class CastCodec final : public CodecBase {
 public:
  using CodecBase::CodecBase;

  Status encode(const float* values, int64_t n, float* residual, uint64_t step, std::vector<std::byte>* out) const override {
    uint16_t* dst = reinterpret_cast<uint16_t*>(start(out, n, step));
    const bool bad = residual ? run<true>(values, n, residual, dst) : run<false>(values, n, residual, dst);
    if (bad) return notFiniteAt(values, nullptr, n, codecName(o_.kind));
    return Status::ok();
  }

  // One pass: cast, and the residual what the cast lost (true: a value was
  // not finite).
  template <bool kResidual>
  static bool run(const float* values, int64_t n, float* residual, uint16_t* dst) {
    constexpr float kMax = kBf16 ? kBf16Max : kHalfMax;
    uint32_t worst = 0;  // the largest exponent field seen: all ones for inf or NaN
    int64_t i = 0;
    if constexpr (!kBf16) i = fp16Lanes<kResidual>(values, n, residual, dst, &worst);
#pragma omp simd reduction(max : worst)
    for (int64_t j = i; j < n; ++j) {
      const float v = kResidual ? values[j] + residual[j] : values[j];
      worst = std::max(worst, std::bit_cast<uint32_t>(v) & kExponent);
      const float c = clampTo(v, kMax);
      float back;
      if constexpr (kBf16) {
        dst[j] = toBf16(c);
        back = fromBf16(dst[j]);
      } else {
        const _Float16 h = _Float16(c);
        dst[j] = std::bit_cast<uint16_t>(h);
        back = float(h);
      }
      if constexpr (kResidual) residual[j] = v - back;
    }
    return worst == kExponent;
  }

  // fp16 eight at a time with F16C where the build has it (the same
  // rounding as the scalar cast: to nearest even); returns where it
  // stopped.
  template <bool kResidual>
  static int64_t fp16Lanes(const float* values, int64_t n, float* residual, uint16_t* dst, uint32_t* worst) {
    int64_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
    const __m256 hi = _mm256_set1_ps(kHalfMax), lo = _mm256_set1_ps(-kHalfMax);
    const __m256i exponent = _mm256_set1_epi32(int(kExponent));
    __m256i w = _mm256_setzero_si256();
    for (; i + 8 <= n; i += 8) {
      __m256 v = _mm256_loadu_ps(values + i);
      if constexpr (kResidual) v = _mm256_add_ps(v, _mm256_loadu_ps(residual + i));
      w = _mm256_max_epu32(w, _mm256_and_si256(_mm256_castps_si256(v), exponent));
      const __m128i h = _mm256_cvtps_ph(_mm256_min_ps(_mm256_max_ps(v, lo), hi), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
      if constexpr (kResidual) _mm256_storeu_ps(residual + i, _mm256_sub_ps(v, _mm256_cvtph_ps(h)));
    }
    alignas(32) uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), w);
    for (uint32_t l : lanes) *worst = std::max(*worst, l);
#else
    (void)values, (void)n, (void)residual, (void)dst, (void)worst;
#endif
    return i;
  }

  Status decode(const std::byte* data, size_t bytes, int64_t n, float* out, bool accumulate) const override {
    Header h;
    Status s = check(data, bytes, n, &h);
    if (!s.isOk()) return s;
    const uint16_t* src = reinterpret_cast<const uint16_t*>(data + kCodecHeaderBytes);
    uint32_t worst = 0;
    int64_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
    if constexpr (!kBf16) {
      const __m256i exponent = _mm256_set1_epi32(int(kExponent));
      __m256i w = _mm256_setzero_si256();
      for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
        w = _mm256_max_epu32(w, _mm256_and_si256(_mm256_castps_si256(v), exponent));
        if (accumulate) v = _mm256_add_ps(v, _mm256_loadu_ps(out + i));
        _mm256_storeu_ps(out + i, v);
      }
      alignas(32) uint32_t lanes[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), w);
      for (uint32_t l : lanes) worst = std::max(worst, l);
    }
#endif
#pragma omp simd reduction(max : worst)
    for (int64_t j = i; j < n; ++j) {
      float v;
      if constexpr (kBf16) {
        v = fromBf16(src[j]);
      } else {
        v = float(std::bit_cast<_Float16>(src[j]));
      }
      worst = std::max(worst, std::bit_cast<uint32_t>(v) & kExponent);
      out[j] = accumulate ? out[j] + v : v;
    }
    if (worst == kExponent) {
      return Status::corruption(fmt::format("{}: the encoding holds a value that is not finite", codecName(o_.kind)));
    }
    return Status::ok();
  }
};

// ------------------------------------------------------------------- int8

// Uniform in [0, 1) from (draw, index): the stochastic rounding's coin (a
// 32-bit integer hash, so that it vectorises lane by lane).
inline float coin(uint32_t draw, uint32_t i) {
  uint32_t h = (i ^ draw) * 0x9e3779b1u;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return float(h >> 8) * 0x1p-24f;
}

class Int8Codec final : public CodecBase {
 public:
  using CodecBase::CodecBase;

  Status encode(const float* values, int64_t n, float* residual, uint64_t step, std::vector<std::byte>* out) const override {
    const int64_t nc = chunks(n);
    std::byte* p = start(out, n, step);
    float* scales = reinterpret_cast<float*>(p);
    int8_t* q = reinterpret_cast<int8_t*>(p + nc * 4);
    const uint64_t mixed = hashCombine(o_.seed, step);
    const uint32_t draw = uint32_t(mixed ^ (mixed >> 32));
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t b = c * o_.chunk, e = std::min(n, b + o_.chunk);
      const bool bad = residual ? chunk<true>(values, residual, b, e, draw, &scales[c], q)
                                : chunk<false>(values, residual, b, e, draw, &scales[c], q);
      if (bad) return notFiniteAt(values, residual, n, "int8");
    }
    return Status::ok();
  }

  // One chunk [b, e): its scale, then every value rounded (true: a value
  // was not finite).
  template <bool kResidual>
  static bool chunk(const float* values, float* residual, int64_t b, int64_t e, uint32_t draw, float* scaleOut,
                    int8_t* q) {
    float maxAbs = 0;
    uint32_t worst = 0;
#pragma omp simd reduction(max : worst) reduction(max : maxAbs)
    for (int64_t i = b; i < e; ++i) {
      const float v = kResidual ? values[i] + residual[i] : values[i];
      worst = std::max(worst, std::bit_cast<uint32_t>(v) & kExponent);
      const float a = std::fabs(v);
      maxAbs = a > maxAbs ? a : maxAbs;
    }
    if (worst == kExponent) return true;
    const float scale = maxAbs / 127.0f;
    // (A chunk of tiny values: 127 / maxAbs overflows below about 3.7e-37;
    // the largest float instead keeps every t finite and in [-127, 128):
    // the values round to 0 or 1 step and the residual keeps the rest.)
    const float inv = maxAbs > 0 ? std::min(127.0f / maxAbs, FLT_MAX) : 0.0f;
    std::memcpy(scaleOut, &scale, 4);
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const float v = kResidual ? values[i] + residual[i] : values[i];
      // floor(v / scale + u), u uniform in [0, 1): unbiased (|t| <= 128,
      // so the integer cast and one correction are the floor).
      const float t = v * inv + coin(draw, uint32_t(i));
      int32_t k = int32_t(t);
      k -= float(k) > t ? 1 : 0;
      k = std::min(std::max(k, -127), 127);
      q[i] = int8_t(k);
      if constexpr (kResidual) residual[i] = v - float(k) * scale;
    }
    return false;
  }

  Status decode(const std::byte* data, size_t bytes, int64_t n, float* out, bool accumulate) const override {
    const int64_t nc = chunks(n);
    Header h;
    Status s = check(data, bytes, n, &h);
    if (!s.isOk()) return s;
    const std::byte* p = data + kCodecHeaderBytes;
    const int8_t* q = reinterpret_cast<const int8_t*>(p + nc * 4);
    for (int64_t c = 0; c < nc; ++c) {
      float scale;
      std::memcpy(&scale, p + c * 4, 4);
      if (notFinite(scale) || scale < 0) {
        return Status::corruption(fmt::format("int8: chunk {}'s scale is {}", c, scale));
      }
      const int64_t b = c * o_.chunk, e = std::min(n, b + o_.chunk);
      int32_t least = 0;
#pragma omp simd reduction(min : least)
      for (int64_t i = b; i < e; ++i) {
        least = std::min(least, int32_t(q[i]));
        const float v = float(q[i]) * scale;
        out[i] = accumulate ? out[i] + v : v;
      }
      if (least == -128) {
        for (int64_t i = b; i < e; ++i) {
          if (q[i] == -128) return Status::corruption(fmt::format("int8: value {} is -128 (the codec sends -127 to 127)", i));
        }
      }
    }
    return Status::ok();
  }
};

// ----------------------------------------------------------------- onebit

class OneBitCodec final : public CodecBase {
 public:
  using CodecBase::CodecBase;

  Status encode(const float* values, int64_t n, float* residual, uint64_t step, std::vector<std::byte>* out) const override {
    const int64_t nc = chunks(n);
    std::byte* p = start(out, n, step);
    uint8_t* bits = reinterpret_cast<uint8_t*>(p + nc * 4);
    std::memset(bits, 0, size_t((n + 7) / 8));
    bool bad = false;
    for (int64_t c = 0; c < nc; ++c) {
      const int64_t b = c * o_.chunk, e = std::min(n, b + o_.chunk);
      // The mean magnitude, summed in 8 double lanes (then in a fixed
      // order): the loop vectorises, the result is the same every time, and
      // no sum of finite floats overflows.
      double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      uint32_t exps = 0;  // notFinite, per value, folded (vectorises)
      int64_t i = b;
      for (; i + 8 <= e; i += 8) {
        for (int j = 0; j < 8; ++j) {
          const float v = values[i + j] + (residual ? residual[i + j] : 0.0f);
          exps |= ((std::bit_cast<uint32_t>(v) & kExponent) == kExponent) ? 1u : 0u;
          lanes[j] += double(std::fabs(v));
        }
      }
      for (; i < e; ++i) {
        const float v = values[i] + (residual ? residual[i] : 0.0f);
        exps |= notFinite(v) ? 1u : 0u;
        lanes[0] += double(std::fabs(v));
      }
      bad = exps != 0;
      if (bad) return notFiniteAt(values, residual, n, "onebit");
      const double sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
      const float scale = float(sum / double(e - b));  // the mean magnitude
      std::memcpy(p + c * 4, &scale, 4);
      i = b;
      if (b % 8 == 0) {
        // Whole bytes: eight signs at a time, no read-modify-write.
        for (; i + 8 <= e; i += 8) {
          uint32_t byte = 0;
          for (int j = 0; j < 8; ++j) {
            const float v = values[i + j] + (residual ? residual[i + j] : 0.0f);
            const bool positive = v >= 0;
            byte |= uint32_t(positive) << j;
            if (residual) residual[i + j] = v - (positive ? scale : -scale);
          }
          bits[i >> 3] = uint8_t(byte);
        }
      }
      for (; i < e; ++i) {
        const float v = values[i] + (residual ? residual[i] : 0.0f);
        const bool positive = v >= 0;
        if (positive) bits[i >> 3] = uint8_t(bits[i >> 3] | (1u << (i & 7)));
        if (residual) residual[i] = v - (positive ? scale : -scale);
      }
    }
    return Status::ok();
  }

  Status decode(const std::byte* data, size_t bytes, int64_t n, float* out, bool accumulate) const override {
    const int64_t nc = chunks(n);
    Header h;
    Status s = check(data, bytes, n, &h);
    if (!s.isOk()) return s;
    const std::byte* p = data + kCodecHeaderBytes;
    const uint8_t* bits = reinterpret_cast<const uint8_t*>(p + nc * 4);
    s = format::checkTailBits(bits, n);
    if (!s.isOk()) return s;
    for (int64_t c = 0; c < nc; ++c) {
      float scale;
      std::memcpy(&scale, p + c * 4, 4);
      if (notFinite(scale) || scale < 0) return Status::corruption(fmt::format("onebit: chunk {}'s scale is {}", c, scale));
      const int64_t b = c * o_.chunk, e = std::min(n, b + o_.chunk);
      int64_t i = b;
      if (b % 8 == 0) {
        for (; i + 8 <= e; i += 8) {  // a byte of signs at a time
          const uint32_t byte = bits[i >> 3];
          for (int j = 0; j < 8; ++j) {
            const float v = (byte >> j) & 1u ? scale : -scale;
            out[i + j] = accumulate ? out[i + j] + v : v;
          }
        }
      }
      for (; i < e; ++i) {
        const float v = (bits[i >> 3] >> (i & 7)) & 1u ? scale : -scale;
        out[i] = accumulate ? out[i] + v : v;
      }
    }
    return Status::ok();
  }
};

// ----------------------------------------------------------- topk, randomk

// What the two sparse codecs share: k values at k indices, the rest 0.
class SparseCodec : public CodecBase {
 public:
  using CodecBase::CodecBase;

 protected:
  // Sends values[idx] (plus residual) and leaves the residual holding all
  // the rest: what was sent is sent exactly.
  Status gather(const float* values, int64_t n, float* residual, const std::vector<uint32_t>& idx, float* dst) const {
    bool bad = false;
    for (size_t j = 0; j < idx.size(); ++j) {
      const uint32_t i = idx[j];
      const float v = values[i] + (residual ? residual[i] : 0.0f);
      bad |= notFinite(v);
      dst[j] = v;
    }
    if (residual) {
      uint32_t worst = 0;  // the largest exponent field: all ones for inf or NaN (vectorises)
#pragma omp simd reduction(max : worst)
      for (int64_t i = 0; i < n; ++i) {
        const float v = values[i] + residual[i];
        worst = std::max(worst, std::bit_cast<uint32_t>(v) & kExponent);
        residual[i] = v;
      }
      bad |= worst == kExponent;
      for (uint32_t i : idx) residual[i] = 0;
    }
    if (bad) return notFiniteAt(values, nullptr, n, codecName(o_.kind));
    return Status::ok();
  }
  Status scatter(const uint32_t* idx, const float* vals, int64_t k, int64_t n, float* out, bool accumulate) const {
    if (!accumulate) std::fill(out, out + n, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      if (notFinite(vals[j])) return Status::corruption(fmt::format("{}: value {} is not finite", codecName(o_.kind), j));
      out[idx[j]] += vals[j];
    }
    return Status::ok();
  }
};

// The k-th largest of the n magnitudes |values + residual| (1 <= k < n),
// exactly. A sample first gives a bound that about 2k values pass; the
// selection then runs over those only (a filtering pass instead of a
// selection over all n), and over all of them when the sample was unlucky
// and fewer than k pass. Magnitudes are worked out where they are needed
// (no n-long copy but in that last case).
float kthLargest(const float* values, const float* residual, int64_t n, int64_t k) {
  auto mag = [&](int64_t i) { return std::fabs(values[i] + (residual ? residual[i] : 0.0f)); };
  std::vector<float> sel;
  const int64_t samples = std::min<int64_t>(n, std::max<int64_t>(1024, n / 64));
  const int64_t rank = int64_t(std::ceil(2.0 * double(k) * double(samples) / double(n)));
  if (samples < n && rank < samples) {
    sel.resize(size_t(samples));
    for (int64_t j = 0; j < samples; ++j) sel[size_t(j)] = mag(j * n / samples);
    std::nth_element(sel.begin(), sel.begin() + rank, sel.end(), std::greater<float>());
    const float bound = sel[size_t(rank)];
    sel.clear();
    sel.reserve(size_t(std::min<int64_t>(n, 4 * k + 1024)));
    int64_t equal = 0;  // (many values may share the bound: exact zeros)
    for (int64_t i = 0; i < n; ++i) {
      const float m = mag(i);
      if (m > bound) sel.push_back(m);
      equal += m == bound ? 1 : 0;
    }
    if (int64_t(sel.size()) >= k) {
      // Every value left out is at most `bound`, and k values are above
      // it: the k-th largest is among these.
      std::nth_element(sel.begin(), sel.begin() + (k - 1), sel.end(), std::greater<float>());
      return sel[size_t(k - 1)];
    }
    // Fewer than k above the bound, but with those equal to it k or more:
    // the k-th largest is the bound itself.
    if (int64_t(sel.size()) + equal >= k) return bound;
  }
  sel.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) sel[size_t(i)] = mag(i);
  std::nth_element(sel.begin(), sel.begin() + (k - 1), sel.end(), std::greater<float>());
  return sel[size_t(k - 1)];
}

class TopKCodec final : public SparseCodec {
 public:
  using SparseCodec::SparseCodec;

  Status encode(const float* values, int64_t n, float* residual, uint64_t step, std::vector<std::byte>* out) const override {
    if (n < 0 || uint64_t(n) > UINT32_MAX) {
      return Status::invalidArgument(fmt::format("topk: {} values: an encoding holds 0 to 2^32 - 1", n));
    }
    const int64_t k = sparseK(n);
    uint32_t worst = 0;  // the largest exponent field: all ones for inf or NaN (vectorises)
#pragma omp simd reduction(max : worst)
    for (int64_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::bit_cast<uint32_t>(values[i] + (residual ? residual[i] : 0.0f)) & kExponent);
    }
    if (worst == kExponent) return notFiniteAt(values, residual, n, "topk");
    auto mag = [&](int64_t i) { return std::fabs(values[i] + (residual ? residual[i] : 0.0f)); };
    // The k largest magnitudes, ties to the lower index: the same choice
    // for the same values on every host. The k-th largest magnitude t
    // comes from kthLargest; then one pass in index order takes every
    // value above t and the first of those equal to it until there are k,
    // so the indices come out sorted.
    std::vector<uint32_t> idx;
    idx.reserve(size_t(k));
    if (k < n) {
      const float t = kthLargest(values, residual, n, k);
      int64_t above = 0;
      for (int64_t i = 0; i < n; ++i) above += mag(i) > t ? 1 : 0;
      int64_t ties = k - above;
      for (int64_t i = 0; i < n && int64_t(idx.size()) < k; ++i) {
        const float m = mag(i);
        if (m > t || (m == t && ties-- > 0)) idx.push_back(uint32_t(i));
      }
    } else {
      for (int64_t i = 0; i < n; ++i) idx.push_back(uint32_t(i));
    }
    std::byte* p = start(out, n, step);
    std::memcpy(p, idx.data(), size_t(k) * 4);
    return gather(values, n, residual, idx, reinterpret_cast<float*>(p + k * 4));
  }

  Status decode(const std::byte* data, size_t bytes, int64_t n, float* out, bool accumulate) const override {
    const int64_t k = sparseK(n);
    Header h;
    Status s = check(data, bytes, n, &h);
    if (!s.isOk()) return s;
    const std::byte* p = data + kCodecHeaderBytes;
    std::vector<uint32_t> idx(static_cast<size_t>(k));
    std::memcpy(idx.data(), p, size_t(k) * 4);
    s = format::checkIndices(o_, idx.data(), k, n);
    if (!s.isOk()) return s;
    std::vector<float> vals(static_cast<size_t>(k));
    std::memcpy(vals.data(), p + k * 4, size_t(k) * 4);
    return scatter(idx.data(), vals.data(), k, n, out, accumulate);
  }
};

class RandomKCodec final : public SparseCodec {
 public:
  using SparseCodec::SparseCodec;

  Status encode(const float* values, int64_t n, float* residual, uint64_t step, std::vector<std::byte>* out) const override {
    if (n < 0 || uint64_t(n) > UINT32_MAX) {
      return Status::invalidArgument(fmt::format("randomk: {} values: an encoding holds 0 to 2^32 - 1", n));
    }
    const int64_t k = sparseK(n);
    const std::vector<uint32_t> idx = randomIndices(o_.seed, step, n, k);
    std::byte* p = start(out, n, step);
    return gather(values, n, residual, idx, reinterpret_cast<float*>(p));
  }

  Status decode(const std::byte* data, size_t bytes, int64_t n, float* out, bool accumulate) const override {
    const int64_t k = sparseK(n);
    Header h;
    Status s = check(data, bytes, n, &h);
    if (!s.isOk()) return s;
    const std::vector<uint32_t> idx = randomIndices(o_.seed, h.step, n, k);
    std::vector<float> vals(static_cast<size_t>(k));
    std::memcpy(vals.data(), data + kCodecHeaderBytes, size_t(k) * 4);
    return scatter(idx.data(), vals.data(), k, n, out, accumulate);
  }
};

// ------------------------------------------------------------------- none

// The values as they are (a path that compresses nothing still frames its
// bytes the same way).
class NoneCodec final : public CodecBase {
 public:
  using CodecBase::CodecBase;
  Status encode(const float* values, int64_t n, float* residual, uint64_t step, std::vector<std::byte>* out) const override {
    float* dst = reinterpret_cast<float*>(start(out, n, step));
    bool bad = false;
    for (int64_t i = 0; i < n; ++i) {
      const float v = values[i] + (residual ? residual[i] : 0.0f);
      bad |= notFinite(v);
      dst[i] = v;
      if (residual) residual[i] = 0;
    }
    if (bad) return notFiniteAt(dst, nullptr, n, "none");
    return Status::ok();
  }
  Status decode(const std::byte* data, size_t bytes, int64_t n, float* out, bool accumulate) const override {
    Header h;
    Status s = check(data, bytes, n, &h);
    if (!s.isOk()) return s;
    const std::byte* p = data + kCodecHeaderBytes;
    bool bad = false;
    for (int64_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, p + i * 4, 4);
      bad |= notFinite(v);
      out[i] = accumulate ? out[i] + v : v;
    }
    if (bad) return Status::corruption("none: the encoding holds a value that is not finite");
    return Status::ok();
  }
};

}  // namespace

std::unique_ptr<Codec> makeCodec(const CodecOptions& o) {
  switch (o.kind) {
    case CodecKind::kNone: return std::make_unique<NoneCodec>(o);
    case CodecKind::kFp16: return std::make_unique<CastCodec<false>>(o);
    case CodecKind::kBf16: return std::make_unique<CastCodec<true>>(o);
    case CodecKind::kInt8: return std::make_unique<Int8Codec>(o);
    case CodecKind::kOneBit: return std::make_unique<OneBitCodec>(o);
    case CodecKind::kTopK: return std::make_unique<TopKCodec>(o);
    case CodecKind::kRandomK: return std::make_unique<RandomKCodec>(o);
  }
  return nullptr;
}

}  // namespace troupe::kernels::cpu
