#include "kernels/codec_format.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include <fmt/format.h>

#include "common/check.h"
#include "common/hash.h"

namespace troupe::kernels {

// ------------------------------------------------- kernels/codec.h's own

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

std::vector<uint32_t> randomIndices(uint64_t seed, uint64_t step, int64_t n, int64_t k) {
  // Floyd's sampling: k distinct indices of n from one stream of (seed,
  // step, n); for each j of the last k indices a draw t below j + 1, taken
  // unless already chosen, else j itself. The set chosen depends only on
  // the draws, so how membership is kept is free: a bitmap of n bits where
  // that is at most 16 bytes a chosen index (its scan then gives them
  // sorted), else a hash set sorted at the end.
  std::vector<uint32_t> out;
  if (n <= 0 || k <= 0) return out;
  TROUPE_CHECK(uint64_t(n) <= UINT32_MAX, "randomIndices: {} values, at most 2^32 - 1", n);
  k = std::min(k, n);
  Rng rng(hashCombine(seed, step, uint64_t(n)));
  out.reserve(size_t(k));
  if (n <= 128 * k) {
    std::vector<uint64_t> chosen(size_t((n + 63) / 64), 0);
    for (int64_t j = n - k; j < n; ++j) {
      uint64_t t = rng.below(uint64_t(j) + 1);
      if (chosen[t >> 6] >> (t & 63) & 1u) t = uint64_t(j);
      chosen[t >> 6] |= uint64_t{1} << (t & 63);
    }
    for (size_t w = 0; w < chosen.size(); ++w) {
      for (uint64_t bits = chosen[w]; bits != 0; bits &= bits - 1) {
        out.push_back(uint32_t(w * 64 + uint64_t(std::countr_zero(bits))));
      }
    }
    return out;
  }
  std::unordered_set<uint32_t> chosen;
  chosen.reserve(size_t(k));
  for (int64_t j = n - k; j < n; ++j) {
    const uint32_t t = uint32_t(rng.below(uint64_t(j) + 1));
    if (!chosen.insert(t).second) chosen.insert(uint32_t(j));
  }
  out.assign(chosen.begin(), chosen.end());
  std::sort(out.begin(), out.end());
  return out;
}

namespace format {

int64_t chunks(const CodecOptions& o, int64_t n) { return (n + o.chunk - 1) / o.chunk; }

int64_t sparseK(const CodecOptions& o, int64_t n) {
  if (n <= 0) return 0;
  return std::clamp<int64_t>(int64_t(std::ceil(o.fraction * double(n))), 1, n);
}

uint32_t param(const CodecOptions& o, int64_t n) {
  switch (o.kind) {
    case CodecKind::kInt8:
    case CodecKind::kOneBit: return uint32_t(o.chunk);
    case CodecKind::kTopK:
    case CodecKind::kRandomK: return uint32_t(sparseK(o, n));
    default: return 0;
  }
}

size_t payloadBytes(const CodecOptions& o, int64_t n) {
  n = std::max<int64_t>(n, 0);
  const size_t count = size_t(n);
  switch (o.kind) {
    case CodecKind::kNone: return count * 4;
    case CodecKind::kFp16:
    case CodecKind::kBf16: return count * 2;
    case CodecKind::kInt8: return size_t(chunks(o, n)) * 4 + count;
    case CodecKind::kOneBit: return size_t(chunks(o, n)) * 4 + (count + 7) / 8;
    case CodecKind::kTopK: return size_t(sparseK(o, n)) * 8;
    case CodecKind::kRandomK: return size_t(sparseK(o, n)) * 4;
  }
  return 0;
}

std::byte* start(const CodecOptions& o, std::vector<std::byte>* out, int64_t n, uint64_t step) {
  TROUPE_CHECK(n >= 0 && uint64_t(n) <= UINT32_MAX, "codec {}: {} values to encode", codecName(o.kind), n);
  Header h;
  h.kind = uint8_t(o.kind);
  h.n = uint64_t(n);
  h.param = param(o, n);
  h.step = step;
  out->resize(kCodecHeaderBytes + payloadBytes(o, n));
  std::memcpy(out->data(), &h, sizeof h);
  return out->data() + kCodecHeaderBytes;
}

Status check(const CodecOptions& o, const std::byte* data, size_t bytes, int64_t n, Header* h) {
  const char* name = codecName(o.kind);
  if (n < 0) return Status::invalidArgument(fmt::format("{}: {} values expected", name, n));
  if (bytes < kCodecHeaderBytes) {
    return Status::corruption(
        fmt::format("{}: {} bytes, fewer than the {}-byte header of an encoding", name, bytes, kCodecHeaderBytes));
  }
  std::memcpy(h, data, sizeof *h);
  if (h->magic != kMagic) return Status::corruption(fmt::format("{}: not an encoded gradient (magic {:08x})", name, h->magic));
  if (h->version != kVersion) {
    return Status::corruption(fmt::format("{}: encoding version {}, this build reads {}", name, h->version, kVersion));
  }
  if (h->kind != uint8_t(o.kind)) {
    return Status::corruption(fmt::format("{}: encoded by codec {} ({})", name,
                                          h->kind <= uint8_t(CodecKind::kRandomK) ? codecName(CodecKind(h->kind)) : "unknown",
                                          h->kind));
  }
  if (h->reserved != 0 || h->reserved2 != 0) return Status::corruption(fmt::format("{}: reserved header fields set", name));
  if (h->n != uint64_t(n)) return Status::corruption(fmt::format("{}: the encoding holds {} values, {} expected", name, h->n, n));
  const uint32_t p = param(o, n);
  if (h->param != p) {
    return Status::corruption(fmt::format("{}: the encoding's {} is {}, {} expected", name,
                                          o.kind == CodecKind::kTopK || o.kind == CodecKind::kRandomK ? "k" : "chunk",
                                          h->param, p));
  }
  const size_t payload = payloadBytes(o, n);
  if (bytes - kCodecHeaderBytes != payload) {
    return Status::corruption(
        fmt::format("{}: {} bytes of payload, {} expected for {} values", name, bytes - kCodecHeaderBytes, payload, n));
  }
  return Status::ok();
}

Status checkIndices(const CodecOptions& o, const uint32_t* idx, int64_t k, int64_t n) {
  for (int64_t j = 0; j < k; ++j) {
    if (idx[j] >= uint64_t(n) || (j > 0 && idx[j] <= idx[j - 1])) {
      return Status::corruption(fmt::format("{}: index {} ({}) is out of range (n = {}) or not above the one before",
                                            codecName(o.kind), j, idx[j], n));
    }
  }
  return Status::ok();
}

Status checkTailBits(const uint8_t* bits, int64_t n) {
  if (n % 8 != 0 && (bits[n / 8] >> (n % 8)) != 0) {
    return Status::corruption(fmt::format("onebit: bits set past the {} values", n));
  }
  return Status::ok();
}

}  // namespace format
}  // namespace troupe::kernels
