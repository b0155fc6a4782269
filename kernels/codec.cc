#include "kernels/codec.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "common/check.h"
#include "common/hash.h"
#include "kernels/cpu/codecs.h"

namespace troupe::kernels {

const char* codecName(CodecKind kind) {
  switch (kind) {
    case CodecKind::kNone: return "none";
    case CodecKind::kFp16: return "fp16";
    case CodecKind::kBf16: return "bf16";
    case CodecKind::kInt8: return "int8";
    case CodecKind::kOneBit: return "onebit";
    case CodecKind::kTopK: return "topk";
    case CodecKind::kRandomK: return "randomk";
  }
  return "?";
}

std::optional<CodecKind> codecKindOf(std::string_view name) {
  for (auto k : {CodecKind::kNone, CodecKind::kFp16, CodecKind::kBf16, CodecKind::kInt8, CodecKind::kOneBit,
                 CodecKind::kTopK, CodecKind::kRandomK}) {
    if (name == codecName(k)) return k;
  }
  return std::nullopt;
}

std::unique_ptr<Codec> makeCodec(const CodecOptions& o) {
  if (!(o.fraction > 0 && o.fraction <= 1)) {
    TROUPE_SETUP_ERROR("codec {}: fraction must be in (0, 1], got {}", codecName(o.kind), o.fraction);
  }
  if (o.chunk < 1 || o.chunk > (int64_t{1} << 20)) {
    TROUPE_SETUP_ERROR("codec {}: chunk must be 1 to 2^20 values, got {}", codecName(o.kind), o.chunk);
  }
  return cpu::makeCodec(o);
}

std::vector<uint32_t> randomIndices(uint64_t seed, uint64_t step, int64_t n, int64_t k) {
  // Floyd's sampling: k distinct indices of n in O(k log k), from one
  // stream of (seed, step, n).
  std::vector<uint32_t> out;
  if (n <= 0 || k <= 0) return out;
  k = std::min(k, n);
  Rng rng(hashCombine(seed, step, uint64_t(n)));
  std::set<uint32_t> chosen;
  for (int64_t j = n - k; j < n; ++j) {
    const uint32_t t = uint32_t(rng.below(uint64_t(j) + 1));
    if (!chosen.insert(t).second) chosen.insert(uint32_t(j));
  }
  out.assign(chosen.begin(), chosen.end());
  return out;
}

}  // namespace troupe::kernels
