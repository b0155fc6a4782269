// Gradient compression codecs (DESIGN.md, Compression): one interface for
// the parameter-server pushes, the pulls and the all-reduce, so a job picks
// a codec by name for each path (`compression.*`).
//
//   fp16, bf16   casts (round to nearest even); 2x fewer bytes
//   int8         per chunk of `chunk` values a scale (max |x| / 127) and
//                stochastic rounding (QSGD-style: unbiased), seeded by
//                (seed, step, index); about 4x
//   onebit       per chunk the mean |x| and one sign bit a value (1-bit
//                SGD); about 28x with chunks of 256
//   topk         the ceil(fraction x n) values largest in magnitude, as
//                (index, value) pairs; 50x at 1%
//   randomk      ceil(fraction x n) values at indices drawn from (seed,
//                step), the same on every rank (so that they can be summed
//                where they are, index by index); 100x at 1%
//
// Error feedback: encode takes a residual of the same length (or null).
// With one it encodes gradient + residual and leaves in the residual
// exactly what was not sent (what it encoded minus what decode will give),
// to be added before the next encode: nothing is lost, only delayed.
// An encode that fails (a value not finite: a bug upstream) may have
// updated part of the residual: the caller drops the step's residuals.
//
// The encoded bytes are a 32-byte header (magic "TRCD", the kind, a
// version, n, the chunk or k, the step) and the payload. decode checks every
// field against what it expects (kind, n, lengths, scales finite and not
// negative, indices in range and strictly increasing, values finite) and
// fails with a Status naming what is wrong: encoded bytes arrive from the
// network.
//
// Threading: a Codec is immutable; encode and decode may run on many
// threads at once (each with its own residual and output).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kernels/kernels.h"

namespace troupe::kernels {

enum class CodecKind : uint8_t { kNone = 0, kFp16 = 1, kBf16 = 2, kInt8 = 3, kOneBit = 4, kTopK = 5, kRandomK = 6 };

// "none", "fp16", "bf16", "int8", "onebit", "topk", "randomk".
const char* codecName(CodecKind kind);
std::optional<CodecKind> codecKindOf(std::string_view name);

struct CodecOptions {
  CodecKind kind = CodecKind::kNone;
  double fraction = 0.01;  // topk, randomk: the share of the values sent (0, 1]
  int64_t chunk = 256;     // int8, onebit: values per scale (1 to 2^20)
  uint64_t seed = 1;       // int8's rounding, randomk's indices
};

inline constexpr size_t kCodecHeaderBytes = 32;

class Codec {
 public:
  virtual ~Codec() = default;
  Codec(const Codec&) = delete;
  Codec& operator=(const Codec&) = delete;

  virtual CodecKind kind() const = 0;
  // The bytes an encoding of n values takes at most (exactly, but for the
  // sparse codecs' k, which the fraction fixes).
  virtual size_t encodedBytes(int64_t n) const = 0;
  // Encodes n values of `values` (plus `residual`, when not null, which is
  // then left holding what was not sent) into *out (replaced). `step`
  // seeds the random choices (int8's rounding, randomk's indices): every
  // rank encoding the same step draws the same.
  virtual Status encode(const float* values, int64_t n, float* residual, uint64_t step,
                        std::vector<std::byte>* out) const = 0;
  // Decodes an encoding of exactly n values into out[0..n) (a value not
  // sent is 0), or adds it there when `accumulate`.
  virtual Status decode(const std::byte* data, size_t bytes, int64_t n, float* out, bool accumulate) const = 0;

 protected:
  Codec() = default;
};

// The codec for `options`. Throws SetupError naming the option that is
// out of range (a fraction not in (0, 1], a chunk not in [1, 2^20]).
//
// On Device::kCuda (kernels/cuda/cuda_codec.h: a build with CUDA and a
// machine with a GPU, else SetupError) the float arrays encode and decode
// take are device memory and the encoded bytes host memory; the bytes and
// the residuals are the CPU codec's, bit for bit.
std::unique_ptr<Codec> makeCodec(const CodecOptions& options, Device device = Device::kCpu);

// For randomk: the k indices (sorted) of n (at most 2^32 - 1) that step
// `step` of `seed` draws; the same on every host.
std::vector<uint32_t> randomIndices(uint64_t seed, uint64_t step, int64_t n, int64_t k);

}  // namespace troupe::kernels
