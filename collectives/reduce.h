// Element-wise kernels of the CPU collectives: dst += src and dst *= scale,
// for float32, bfloat16 and float16 buffers. Half types are widened to
// float32, added, and rounded back to nearest even, so a + b == b + a bit
// for bit (what keeps every rank's result identical).
//
// Threading: plain functions over caller-owned memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "transport/frame.h"

namespace troupe::collectives {

inline float bf16ToFloat(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t floatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // NaN stays NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return uint16_t(bits >> 16);
}

float fp16ToFloat(uint16_t h);
uint16_t floatToFp16(float f);

// dst[i] += src[i] for `count` elements of `dtype` (float32, bf16, fp16).
void reduceSum(void* dst, const void* src, size_t count, transport::DType dtype);
// dst[i] *= scale.
void scaleBy(void* dst, size_t count, transport::DType dtype, float scale);

}  // namespace troupe::collectives
