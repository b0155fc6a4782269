// The CUDA twins of the gradient codecs (kernels/codec.h), built only with
// CUDA (TROUPE_HAVE_CUDA); reached through kernels::makeCodec(options,
// Device::kCuda).
//
// Memory: the float arrays (values, residual, out) are device memory
// (cudaMalloc); the encoded bytes are host memory, as on the CPU, since they
// go to the wire: encode copies only the encoded bytes off the GPU, and
// decode copies only them onto it. The bytes and the residual are the CPU
// codec's, bit for bit (the same header, payload, rounding and order of
// sums), so a GPU worker and a CPU shard read each other's encodings.
//
// Validation of an encoding runs where its bytes are: the header, the
// scales, onebit's tail and the sparse codecs' indices and values on the
// host before anything is copied, int8's values (no -128) on the device;
// each failure is a Corruption naming what is wrong, found before any
// out-of-range write and before a bad scale could reach `out`.
//
// Streams: the codec works on a stream of its own, which waits for no
// other: the caller's values and residual must be complete (their producer
// synchronised) when it calls. Each call returns with its work complete, on
// every path, errors included. Limits beyond the CPU codec's: topk takes
// fewer than 2^31 values (an InvalidArgument says so) and about 16 bytes a
// value of scratch for its sort.
//
// Threading: calls on one codec run one at a time (a mutex), on the device
// that was current when it was made (each call makes it current).
#pragma once

#include <memory>

#include "kernels/codec.h"

namespace troupe::kernels::cuda {

// Options already checked by kernels::makeCodec. Throws SetupError when no
// CUDA device is usable.
std::unique_ptr<Codec> createCudaCodec(const CodecOptions& options);

}  // namespace troupe::kernels::cuda
