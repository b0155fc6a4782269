#include "transport/frame.h"

#include <algorithm>
#include <cstring>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <isa-l/crc.h>

#include "transport/internal/envelope.capnp.h"

namespace troupe::transport {
namespace {

// Envelopes and bodies are small: a first segment of 64 words (512 bytes)
// instead of Cap'n Proto's 1024, which it zeroes for every message.
constexpr unsigned kFirstSegmentWords = 64;

void putU32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte((v >> (8 * i)) & 0xff);
}

uint32_t getU32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}

kj::Array<capnp::word> buildEnvelope(const Envelope& e, const std::vector<TensorView>& tensors) {
  capnp::MallocMessageBuilder message(kFirstSegmentWords);
  auto root = message.initRoot<wire::Envelope>();
  root.setSourceNode(e.sourceNode);
  root.setSourceActor(e.sourceActor);
  root.setDestActor(e.destActor);
  root.setRequestId(e.requestId);
  root.setKind(e.kind);
  root.setLinkSeq(e.linkSeq);
  root.setLinkAck(e.linkAck);
  root.setLinkSent(e.linkSent);
  root.setBody(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(e.body.data()), e.body.size()));
  auto list = root.initTensors(unsigned(tensors.size()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    list[unsigned(i)].setBytes(tensors[i].bytes);
    list[unsigned(i)].setDtype(uint8_t(tensors[i].dtype));
  }
  return capnp::messageToFlatArray(message);
}

std::vector<std::byte> frameOf(const Envelope& e, const std::vector<TensorView>& tensors, bool withTensors) {
  kj::Array<capnp::word> words = buildEnvelope(e, tensors);
  const size_t envelopeBytes = words.size() * sizeof(capnp::word);
  size_t total = kFrameHeaderBytes + envelopeBytes;
  if (withTensors) {
    for (const auto& t : tensors) total += paddedTensorBytes(t.bytes);
  }
  std::vector<std::byte> out(total);
  putU32(out.data(), kFrameMagic);
  putU32(out.data() + 4, uint32_t(envelopeBytes));
  std::memcpy(out.data() + kFrameHeaderBytes, words.begin(), envelopeBytes);
  uint32_t crc = frameCrc(out.data() + 4, 4);
  crc = frameCrc(out.data() + kFrameHeaderBytes, envelopeBytes, crc);
  static const std::byte kZeros[8] = {};
  std::byte* p = out.data() + kFrameHeaderBytes + envelopeBytes;
  for (const auto& t : tensors) {
    crc = frameCrc(t.data, t.bytes, crc);
    crc = frameCrc(kZeros, paddedTensorBytes(t.bytes) - t.bytes, crc);
    if (withTensors) {
      if (t.bytes) std::memcpy(p, t.data, t.bytes);
      p += paddedTensorBytes(t.bytes);
    }
  }
  putU32(out.data() + 8, crc);
  return out;
}

}  // namespace

std::vector<std::byte> encodeFrame(const Envelope& envelope, const std::vector<TensorView>& tensors) {
  return frameOf(envelope, tensors, true);
}

std::vector<std::byte> encodeEnvelope(const Envelope& envelope, const std::vector<TensorView>& tensors) {
  return frameOf(envelope, tensors, false);
}

uint32_t frameCrc(const void* data, size_t bytes, uint32_t crc) {
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  while (bytes > 0) {
    const int n = int(std::min<size_t>(bytes, size_t{1} << 30));
    crc = crc32_iscsi(p, n, crc);
    p += n;
    bytes -= size_t(n);
  }
  return crc;
}

Expected<DecodedFrame> decodeFrame(const std::byte* data, size_t size, bool verifyChecksum) {
  if (size < kFrameHeaderBytes) {
    return Status::corruption(fmt::format("frame of {} bytes is shorter than its {}-byte header", size,
                                          kFrameHeaderBytes));
  }
  const uint32_t magic = getU32(data);
  if (magic != kFrameMagic) return Status::corruption(fmt::format("bad frame magic 0x{:08x}", magic));
  const size_t envelopeBytes = getU32(data + 4);
  if (envelopeBytes == 0 || envelopeBytes % sizeof(capnp::word) != 0 || envelopeBytes > kMaxEnvelopeBytes) {
    return Status::corruption(fmt::format("bad envelope length {} (a non-zero multiple of 8, at most {})",
                                          envelopeBytes, kMaxEnvelopeBytes));
  }
  if (envelopeBytes > size - kFrameHeaderBytes) {
    return Status::corruption(fmt::format("envelope of {} bytes does not fit the {}-byte frame", envelopeBytes, size));
  }
  if (getU32(data + 12) != 0) {
    return Status::corruption(fmt::format("reserved header word 0x{:08x} is not zero", getU32(data + 12)));
  }
  if (verifyChecksum) {
    const uint32_t want = getU32(data + 8);
    const uint32_t got = frameCrc(data + kFrameHeaderBytes, size - kFrameHeaderBytes, frameCrc(data + 4, 4));
    if (want != got) {
      return Status::corruption(fmt::format("checksum mismatch: the frame says {:08x}, its {} bytes give {:08x}",
                                            want, size, got));
    }
  }
  // Cap'n Proto reads words in place; copy to aligned storage first.
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(envelopeBytes / sizeof(capnp::word));
  std::memcpy(words.begin(), data + kFrameHeaderBytes, envelopeBytes);
  DecodedFrame frame;
  std::vector<uint64_t> lengths;
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = words.size();  // no reading more than was sent
    options.nestingLimit = 8;
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    auto root = reader.getRoot<wire::Envelope>();
    frame.envelope.sourceNode = root.getSourceNode();
    frame.envelope.sourceActor = root.getSourceActor();
    frame.envelope.destActor = root.getDestActor();
    frame.envelope.requestId = root.getRequestId();
    frame.envelope.kind = root.getKind();
    frame.envelope.linkSeq = root.getLinkSeq();
    frame.envelope.linkAck = root.getLinkAck();
    frame.envelope.linkSent = root.getLinkSent();
    auto body = root.getBody();
    frame.envelope.body.assign(reinterpret_cast<const char*>(body.begin()), body.size());
    auto list = root.getTensors();
    if (list.size() > kMaxTensors) {
      return Status::corruption(fmt::format("{} tensors in one frame (at most {})", list.size(), kMaxTensors));
    }
    for (auto t : list) {
      if (t.getDtype() > uint8_t(DType::kUInt64)) {
        return Status::corruption(fmt::format("unknown tensor dtype {}", t.getDtype()));
      }
      lengths.push_back(t.getBytes());
      frame.tensors.push_back(TensorView{nullptr, t.getBytes(), DType(t.getDtype())});
    }
  } catch (const kj::Exception& e) {
    return Status::corruption(fmt::format("malformed envelope: {}", e.getDescription().cStr()));
  }
  size_t offset = kFrameHeaderBytes + envelopeBytes;
  for (size_t i = 0; i < frame.tensors.size(); ++i) {
    if (lengths[i] > size - offset || paddedTensorBytes(lengths[i]) > size - offset) {
      return Status::corruption(
          fmt::format("tensor {} of {} bytes runs past the frame ({} bytes left)", i, lengths[i], size - offset));
    }
    frame.tensors[i].data = data + offset;
    offset += paddedTensorBytes(lengths[i]);
  }
  if (offset != size) {
    return Status::corruption(fmt::format("{} bytes after the last tensor", size - offset));
  }
  return frame;
}

}  // namespace troupe::transport
