// The gradient codecs' device code (kernels/codec.h): the same bytes and
// residuals as kernels/cpu/codecs.cc, bit for bit. Every float operation
// the CPU codec rounds on its own is written as an explicitly rounded
// intrinsic (__fadd_rn, __fmul_rn, ...) so that nvcc fuses nothing, and
// every sum runs in the CPU codec's order.
#include <cfloat>

#include <cub/cub.cuh>

#include "kernels/cuda/internal/launchers.h"
#include "kernels/cuda/internal/scratch.cuh"

namespace troupe::kernels::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr uint32_t kExponent = 0x7f800000u;
constexpr float kHalfMax = 65504.0f;
constexpr float kBf16Max = 3.38953139e38f;

#define TROUPE_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

__device__ __forceinline__ bool notFinite(float v) { return (__float_as_uint(v) & kExponent) == kExponent; }
__device__ __forceinline__ void flag(unsigned long long* bad, int64_t i) { atomicMin(bad, (unsigned long long)i); }
__device__ __forceinline__ float clampTo(float v, float m) {
  const float c = v > m ? m : v;
  return c < -m ? -m : c;
}
__device__ __forceinline__ float load(const float* values, const float* residual, int64_t i) {
  return residual ? __fadd_rn(values[i], residual[i]) : values[i];
}

// The CPU codec's bf16 rounding (to nearest even), on the bits.
__device__ __forceinline__ uint16_t toBf16(float v) {
  uint32_t u = __float_as_uint(v);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
__device__ __forceinline__ float fromBf16(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
__device__ __forceinline__ uint16_t toHalf(float v) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ float fromHalf(uint16_t b) { return __half2float(__ushort_as_half(b)); }

// int8's coin: the CPU codec's 32-bit hash of (draw, index).
__device__ __forceinline__ float coin(uint32_t draw, uint32_t i) {
  uint32_t h = (i ^ draw) * 0x9e3779b1u;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return __fmul_rn(float(h >> 8), 0x1p-24f);
}

// ------------------------------------------------------------------ casts

template <bool kBf16>
__global__ void castEncodeKernel(const float* values, float* residual, int64_t n, uint16_t* dst,
                                 unsigned long long* bad) {
  TROUPE_GRID_STRIDE(i, n) {
    const float v = load(values, residual, i);
    if (notFinite(v)) flag(bad, i);
    const float c = clampTo(v, kBf16 ? kBf16Max : kHalfMax);
    const uint16_t b = kBf16 ? toBf16(c) : toHalf(c);
    dst[i] = b;
    if (residual) residual[i] = __fsub_rn(v, kBf16 ? fromBf16(b) : fromHalf(b));
  }
}

template <bool kBf16>
__global__ void castDecodeKernel(const uint16_t* src, int64_t n, float* out, bool accumulate,
                                 unsigned long long* bad) {
  TROUPE_GRID_STRIDE(i, n) {
    const float v = kBf16 ? fromBf16(src[i]) : fromHalf(src[i]);
    if (notFinite(v)) flag(bad, i);
    out[i] = accumulate ? __fadd_rn(out[i], v) : v;
  }
}

// ------------------------------------------------------------------- int8

// A block per chunk: the largest magnitude (a max: any order gives the
// same), then every value rounded stochastically.
__global__ void int8EncodeKernel(const float* values, float* residual, int64_t n, int64_t chunk, int64_t chunks,
                                 uint32_t draw, float* scales, int8_t* q, unsigned long long* bad) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float shared;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t b = c * chunk, e = min(n, b + chunk);
    float maxAbs = 0.0f;
    for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
      const float v = load(values, residual, i);
      if (notFinite(v)) flag(bad, i);
      maxAbs = fmaxf(maxAbs, fabsf(v));
    }
    const float m = Reduce(temp).Reduce(maxAbs, [](float a, float x) { return fmaxf(a, x); });
    if (threadIdx.x == 0) shared = m;
    __syncthreads();
    const float top = shared;
    const float scale = __fdiv_rn(top, 127.0f);
    const float inv = top > 0 ? fminf(__fdiv_rn(127.0f, top), FLT_MAX) : 0.0f;  // (as the CPU codec: tiny chunks)
    if (threadIdx.x == 0) scales[c] = scale;
    for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
      const float v = load(values, residual, i);
      const float t = __fadd_rn(__fmul_rn(v, inv), coin(draw, uint32_t(i)));
      int32_t k = int32_t(t);  // toward zero, then one correction: the floor
      k -= float(k) > t ? 1 : 0;
      k = min(max(k, -127), 127);
      q[i] = int8_t(k);
      if (residual) residual[i] = __fsub_rn(v, __fmul_rn(float(k), scale));
    }
    __syncthreads();  // `temp` and `shared` are reused by the next chunk
  }
}

// The scales are checked on the host; `bad` the first value -128.
__global__ void int8DecodeKernel(const float* scales, const int8_t* q, int64_t n, int64_t chunk, float* out,
                                 bool accumulate, unsigned long long* bad) {
  TROUPE_GRID_STRIDE(i, n) {
    const float scale = scales[i / chunk];
    if (q[i] == -128) flag(bad, i);
    const float v = __fmul_rn(float(q[i]), scale);
    out[i] = accumulate ? __fadd_rn(out[i], v) : v;
  }
}

// ----------------------------------------------------------------- onebit

// Eight threads per chunk, as the CPU codec's eight double lanes: lane j
// sums the values b + 8g + j of every whole group g in order, lane 0 then
// the tail; the lanes are added in the CPU codec's tree. (8 consecutive
// threads of one warp: the grid covers every (chunk, lane) exactly, so that
// every thread of a warp reaches the shuffles.)
__global__ void oneBitScaleKernel(const float* values, const float* residual, int64_t n, int64_t chunk,
                                  int64_t chunks, float* scales, unsigned long long* bad) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t c = t >> 3;
  const int j = int(t & 7);
  double lane = 0.0;
  int64_t b = 0, e = 0;
  if (c < chunks) {
    b = c * chunk;
    e = min(n, b + chunk);
    const int64_t groups = (e - b) / 8;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t i = b + 8 * g + j;
      const float v = load(values, residual, i);
      if (notFinite(v)) flag(bad, i);
      lane = __dadd_rn(lane, double(fabsf(v)));
    }
    if (j == 0) {
      for (int64_t i = b + 8 * groups; i < e; ++i) {
        const float v = load(values, residual, i);
        if (notFinite(v)) flag(bad, i);
        lane = __dadd_rn(lane, double(fabsf(v)));
      }
    }
  }
  const int base = int(threadIdx.x & 31u) & ~7;
  double l[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) l[k] = __shfl_sync(0xffffffffu, lane, base + k);
  if (c < chunks && j == 0) {
    const double sum = __dadd_rn(__dadd_rn(__dadd_rn(l[0], l[1]), __dadd_rn(l[2], l[3])),
                                 __dadd_rn(__dadd_rn(l[4], l[5]), __dadd_rn(l[6], l[7])));
    scales[c] = __double2float_rn(__ddiv_rn(sum, double(e - b)));
  }
}

// A thread per byte of signs: each of its eight values against its chunk's
// scale.
__global__ void oneBitSignKernel(const float* values, float* residual, int64_t n, int64_t chunk,
                                 const float* scales, uint8_t* bits) {
  TROUPE_GRID_STRIDE(byte, (n + 7) / 8) {
    uint32_t signs = 0;
    for (int j = 0; j < 8; ++j) {
      const int64_t i = byte * 8 + j;
      if (i >= n) break;
      const float scale = scales[i / chunk];
      const float v = load(values, residual, i);
      const bool positive = v >= 0;
      signs |= uint32_t(positive) << j;
      if (residual) residual[i] = __fsub_rn(v, positive ? scale : -scale);
    }
    bits[byte] = uint8_t(signs);
  }
}

__global__ void oneBitDecodeKernel(const float* scales, const uint8_t* bits, int64_t n, int64_t chunk, float* out,
                                   bool accumulate) {
  TROUPE_GRID_STRIDE(i, n) {
    const float scale = scales[i / chunk];
    const float v = (bits[i >> 3] >> (i & 7)) & 1u ? scale : -scale;
    out[i] = accumulate ? __fadd_rn(out[i], v) : v;
  }
}

// ----------------------------------------------------------- topk, randomk

__global__ void magnitudesKernel(const float* values, const float* residual, int64_t n, float* mag, uint32_t* idx,
                                 unsigned long long* bad) {
  TROUPE_GRID_STRIDE(i, n) {
    const float v = residual ? __fadd_rn(values[i], residual[i]) : __fadd_rn(values[i], 0.0f);
    if (notFinite(v)) flag(bad, i);
    mag[i] = fabsf(v);
    idx[i] = uint32_t(i);
  }
}

__global__ void gatherKernel(const float* values, const float* residual, const uint32_t* idx, int64_t k,
                             float* dst, unsigned long long* bad) {
  TROUPE_GRID_STRIDE(j, k) {
    const uint32_t i = idx[j];
    const float v = residual ? __fadd_rn(values[i], residual[i]) : __fadd_rn(values[i], 0.0f);
    if (notFinite(v)) flag(bad, i);
    dst[j] = v;
  }
}

__global__ void keepRestKernel(const float* values, float* residual, int64_t n, unsigned long long* bad) {
  TROUPE_GRID_STRIDE(i, n) {
    const float v = __fadd_rn(values[i], residual[i]);
    if (notFinite(v)) flag(bad, i);
    residual[i] = v;
  }
}

__global__ void clearSentKernel(float* residual, const uint32_t* idx, int64_t k) {
  TROUPE_GRID_STRIDE(j, k) residual[idx[j]] = 0.0f;
}

// Indices are distinct (checked on the host): no two threads add to one value.
__global__ void scatterKernel(const uint32_t* idx, const float* vals, int64_t k, float* out) {
  TROUPE_GRID_STRIDE(j, k) out[idx[j]] = __fadd_rn(out[idx[j]], vals[j]);
}

// ------------------------------------------------------------------- none

__global__ void plainEncodeKernel(const float* values, float* residual, int64_t n, float* dst,
                                  unsigned long long* bad) {
  TROUPE_GRID_STRIDE(i, n) {
    const float v = residual ? __fadd_rn(values[i], residual[i]) : __fadd_rn(values[i], 0.0f);
    if (notFinite(v)) flag(bad, i);
    dst[i] = v;
    if (residual) residual[i] = 0.0f;
  }
}

__global__ void plainDecodeKernel(const float* src, int64_t n, float* out, bool accumulate, unsigned long long* bad) {
  TROUPE_GRID_STRIDE(i, n) {
    const float v = src[i];
    if (notFinite(v)) flag(bad, i);
    out[i] = accumulate ? __fadd_rn(out[i], v) : v;
  }
}

int gridOf(int64_t n) { return gridFor((long long)n, kThreads); }

}  // namespace

cudaError_t castEncode(const float* values, float* residual, int64_t n, bool bf16, uint16_t* dst,
                       unsigned long long* bad, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (bf16) {
    castEncodeKernel<true><<<gridOf(n), kThreads, 0, stream>>>(values, residual, n, dst, bad);
  } else {
    castEncodeKernel<false><<<gridOf(n), kThreads, 0, stream>>>(values, residual, n, dst, bad);
  }
  return cudaGetLastError();
}

cudaError_t castDecode(const uint16_t* src, int64_t n, bool bf16, float* out, bool accumulate,
                       unsigned long long* bad, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (bf16) {
    castDecodeKernel<true><<<gridOf(n), kThreads, 0, stream>>>(src, n, out, accumulate, bad);
  } else {
    castDecodeKernel<false><<<gridOf(n), kThreads, 0, stream>>>(src, n, out, accumulate, bad);
  }
  return cudaGetLastError();
}

cudaError_t int8Encode(const float* values, float* residual, int64_t n, int64_t chunk, uint32_t draw,
                       float* scales, int8_t* q, unsigned long long* bad, cudaStream_t stream) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks == 0) return cudaSuccess;
  const int grid = int(chunks < (int64_t{1} << 20) ? chunks : (int64_t{1} << 20));
  int8EncodeKernel<<<grid, kThreads, 0, stream>>>(values, residual, n, chunk, chunks, draw, scales, q, bad);
  return cudaGetLastError();
}

cudaError_t int8Decode(const float* scales, const int8_t* q, int64_t n, int64_t chunk, float* out, bool accumulate,
                       unsigned long long* bad, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  int8DecodeKernel<<<gridOf(n), kThreads, 0, stream>>>(scales, q, n, chunk, out, accumulate, bad);
  return cudaGetLastError();
}

cudaError_t oneBitEncode(const float* values, float* residual, int64_t n, int64_t chunk, float* scales,
                         uint8_t* bits, unsigned long long* bad, cudaStream_t stream) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks == 0) return cudaSuccess;
  const int64_t threads = chunks * 8;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  oneBitScaleKernel<<<unsigned(blocks), kThreads, 0, stream>>>(values, residual, n, chunk, chunks, scales, bad);
  TROUPE_CUDA_TRY(cudaGetLastError());
  oneBitSignKernel<<<gridOf((n + 7) / 8), kThreads, 0, stream>>>(values, residual, n, chunk, scales, bits);
  return cudaGetLastError();
}

cudaError_t oneBitDecode(const float* scales, const uint8_t* bits, int64_t n, int64_t chunk, float* out,
                         bool accumulate, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  oneBitDecodeKernel<<<gridOf(n), kThreads, 0, stream>>>(scales, bits, n, chunk, out, accumulate);
  return cudaGetLastError();
}

cudaError_t topKIndices(const float* values, const float* residual, int64_t n, int64_t k, uint32_t* idx,
                        unsigned long long* bad, cudaStream_t stream) {
  if (n == 0 || k == 0) return cudaSuccess;
  if (n > INT32_MAX) return cudaErrorInvalidValue;
  Scratch s(stream);
  float* mag = s.get<float>(size_t(n));
  float* sortedMag = s.get<float>(size_t(n));
  uint32_t* all = s.get<uint32_t>(size_t(n));
  uint32_t* byMagnitude = s.get<uint32_t>(size_t(n));
  TROUPE_CUDA_TRY(s.error());
  magnitudesKernel<<<gridOf(n), kThreads, 0, stream>>>(values, residual, n, mag, all, bad);
  TROUPE_CUDA_TRY(cudaGetLastError());
  // A stable sort by magnitude, largest first: the first k are every value
  // above the k-th largest and, of those equal to it, the lowest indices
  // (the CPU codec's choice).
  size_t bytes = 0;
  TROUPE_CUDA_TRY(cub::DeviceRadixSort::SortPairsDescending(nullptr, bytes, mag, sortedMag, all, byMagnitude,
                                                           int(n), 0, 32, stream));
  void* temp = s.get<std::byte>(bytes);
  TROUPE_CUDA_TRY(s.error());
  TROUPE_CUDA_TRY(cub::DeviceRadixSort::SortPairsDescending(temp, bytes, mag, sortedMag, all, byMagnitude, int(n),
                                                           0, 32, stream));
  // The k chosen, in index order.
  size_t bytes2 = 0;
  TROUPE_CUDA_TRY(cub::DeviceRadixSort::SortKeys(nullptr, bytes2, byMagnitude, idx, int(k), 0, 32, stream));
  void* temp2 = s.get<std::byte>(bytes2);
  TROUPE_CUDA_TRY(s.error());
  TROUPE_CUDA_TRY(cub::DeviceRadixSort::SortKeys(temp2, bytes2, byMagnitude, idx, int(k), 0, 32, stream));
  return cudaSuccess;
}

cudaError_t sparseGather(const float* values, float* residual, int64_t n, const uint32_t* idx, int64_t k,
                         float* dst, unsigned long long* bad, cudaStream_t stream) {
  if (k > 0) {
    gatherKernel<<<gridOf(k), kThreads, 0, stream>>>(values, residual, idx, k, dst, bad);
    TROUPE_CUDA_TRY(cudaGetLastError());
  }
  if (residual && n > 0) {
    keepRestKernel<<<gridOf(n), kThreads, 0, stream>>>(values, residual, n, bad);
    TROUPE_CUDA_TRY(cudaGetLastError());
    if (k > 0) {
      clearSentKernel<<<gridOf(k), kThreads, 0, stream>>>(residual, idx, k);
      TROUPE_CUDA_TRY(cudaGetLastError());
    }
  }
  return cudaSuccess;
}

cudaError_t sparseScatter(const uint32_t* idx, const float* vals, int64_t k, int64_t n, float* out, bool accumulate,
                          cudaStream_t stream) {
  if (!accumulate && n > 0) TROUPE_CUDA_TRY(cudaMemsetAsync(out, 0, size_t(n) * sizeof(float), stream));
  if (k == 0) return cudaSuccess;
  scatterKernel<<<gridOf(k), kThreads, 0, stream>>>(idx, vals, k, out);
  return cudaGetLastError();
}

cudaError_t plainEncode(const float* values, float* residual, int64_t n, float* dst, unsigned long long* bad,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  plainEncodeKernel<<<gridOf(n), kThreads, 0, stream>>>(values, residual, n, dst, bad);
  return cudaGetLastError();
}

cudaError_t plainDecode(const float* src, int64_t n, float* out, bool accumulate, unsigned long long* bad,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  plainDecodeKernel<<<gridOf(n), kThreads, 0, stream>>>(src, n, out, accumulate, bad);
  return cudaGetLastError();
}

}  // namespace troupe::kernels::cuda::internal
