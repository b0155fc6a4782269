#include "kernels/codec.h"

#include "common/check.h"
#include "kernels/cpu/codecs.h"
#include "troupe/config.h"
#if TROUPE_HAVE_CUDA
#include "kernels/cuda/cuda_codec.h"
#endif

namespace troupe::kernels {

std::unique_ptr<Codec> makeCodec(const CodecOptions& o, Device device) {
  if (!(o.fraction > 0 && o.fraction <= 1)) {
    TROUPE_SETUP_ERROR("codec {}: fraction must be in (0, 1], got {}", codecName(o.kind), o.fraction);
  }
  if (o.chunk < 1 || o.chunk > (int64_t{1} << 20)) {
    TROUPE_SETUP_ERROR("codec {}: chunk must be 1 to 2^20 values, got {}", codecName(o.kind), o.chunk);
  }
  switch (device) {
    case Device::kCpu: return cpu::makeCodec(o);
    case Device::kCuda:
#if TROUPE_HAVE_CUDA
      return cuda::createCudaCodec(o);
#else
      TROUPE_SETUP_ERROR("codec {}: Device::kCuda is not available in this build (configured without CUDA)",
                         codecName(o.kind));
#endif
  }
  TROUPE_SETUP_ERROR("codec {}: unknown device {}", codecName(o.kind), static_cast<int>(device));
}

}  // namespace troupe::kernels
