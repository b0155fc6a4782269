#include "collectives/reduce.h"

#include <cmath>

#include "collectives/communicator.h"
#include "common/check.h"

namespace troupe::collectives {

size_t reduceElementBytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kBFloat16:
    case DType::kFloat16: return 2;
    default: return 0;
  }
}

const char* reduceOpName(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "average"; }

float fp16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      const float f = std::ldexp(float(mant), -24);
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToFp16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const uint32_t absBits = bits & 0x7fffffffu;
  if (absBits > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (absBits >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: infinity
  if (absBits < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    const float a = std::fabs(f);
    // Multiples of 2^-24, rounded to nearest even by the FPU's default mode.
    const float q = std::nearbyint(a * 16777216.0f);
    return uint16_t(sign | uint16_t(q));
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  uint32_t m = absBits - (uint32_t(112) << 23);
  m += 0xfffu + ((m >> 13) & 1u);
  return uint16_t(sign | uint16_t(m >> 13));
}

void reduceSum(void* dst, const void* src, size_t count, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: {
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      for (size_t i = 0; i < count; ++i) d[i] += s[i];
      return;
    }
    case DType::kBFloat16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) d[i] = floatToBf16(bf16ToFloat(d[i]) + bf16ToFloat(s[i]));
      return;
    }
    case DType::kFloat16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) d[i] = floatToFp16(fp16ToFloat(d[i]) + fp16ToFloat(s[i]));
      return;
    }
    default: TROUPE_CHECK(false, "reduceSum: dtype {} is not a reduce type", int(dtype));
  }
}

void scaleBy(void* dst, size_t count, DType dtype, float scale) {
  switch (dtype) {
    case DType::kFloat32: {
      float* d = static_cast<float*>(dst);
      for (size_t i = 0; i < count; ++i) d[i] *= scale;
      return;
    }
    case DType::kBFloat16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < count; ++i) d[i] = floatToBf16(bf16ToFloat(d[i]) * scale);
      return;
    }
    case DType::kFloat16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < count; ++i) d[i] = floatToFp16(fp16ToFloat(d[i]) * scale);
      return;
    }
    default: TROUPE_CHECK(false, "scaleBy: dtype {} is not a reduce type", int(dtype));
  }
}

}  // namespace troupe::collectives
