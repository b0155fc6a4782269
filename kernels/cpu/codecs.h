// The CPU codecs behind kernels/codec.h: plain loops over the values that
// the compiler vectorises (-march=native), one pass for encode (the
// residual read and written in the same pass) and one for decode.
#pragma once

#include <memory>

#include "kernels/codec.h"

namespace troupe::kernels::cpu {

// Options already checked by kernels::makeCodec.
std::unique_ptr<Codec> makeCodec(const CodecOptions& options);

}  // namespace troupe::kernels::cpu
