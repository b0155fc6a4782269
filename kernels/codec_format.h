// The layout of an encoded gradient (kernels/codec.h), shared by the CPU
// codecs and their CUDA twins so that both write and read the same bytes:
// the 32-byte header, written and checked, and the payload each kind takes
// for n values. Internal to kernels/. Its library (troupe_codec_format)
// also holds codec.h's device-free functions (names, randomIndices), so
// that both twins link it without linking each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/codec.h"

namespace troupe::kernels::format {

inline constexpr uint32_t kMagic = 0x44435254;  // "TRCD", little-endian
inline constexpr uint8_t kVersion = 1;

struct Header {
  uint32_t magic = kMagic;
  uint8_t kind = 0;
  uint8_t version = kVersion;
  uint16_t reserved = 0;
  uint64_t n = 0;
  uint32_t param = 0;  // int8, onebit: the chunk; topk, randomk: k
  uint32_t reserved2 = 0;
  uint64_t step = 0;
};
static_assert(sizeof(Header) == kCodecHeaderBytes);

// int8, onebit: the chunks n values make.
int64_t chunks(const CodecOptions& o, int64_t n);
// topk, randomk: the values sent of n (ceil(fraction x n), at least 1 of
// n > 0).
int64_t sparseK(const CodecOptions& o, int64_t n);
// The header's param for n values (the chunk, or k), and the payload's
// bytes.
uint32_t param(const CodecOptions& o, int64_t n);
size_t payloadBytes(const CodecOptions& o, int64_t n);

// Replaces *out with the header of an encoding of n values at `step`
// followed by room for the payload; returns where the payload goes.
std::byte* start(const CodecOptions& o, std::vector<std::byte>* out, int64_t n, uint64_t step);

// Checks the header of `data` (bytes long) against the codec `o` and n
// values, and that the payload has the size they make; fills *h. A
// Corruption names the field that is wrong (encoded bytes arrive from the
// network).
Status check(const CodecOptions& o, const std::byte* data, size_t bytes, int64_t n, Header* h);

// topk: k indices of n, each in range and above the one before.
Status checkIndices(const CodecOptions& o, const uint32_t* idx, int64_t k, int64_t n);
// onebit: no sign bit set past the n values (bits holds (n + 7) / 8 bytes).
Status checkTailBits(const uint8_t* bits, int64_t n);

}  // namespace troupe::kernels::format
